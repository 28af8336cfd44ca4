/*
 * json_edit.c: JSON scanning, lookups and byte-preserving member removal on the text itself
 * (see json_edit.h).
 */
#include "json_edit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * JSON scanning
 * ------------------------------------------------------------------------------------------ */

typedef struct jscan {
    const char *s, *e;
    int depth;
    int trusted; /* the text was validated before: values are delimited, not checked */
} jscan;

static void ws(jscan *j)
{
    const char *s = j->s, *e = j->e;
    while (s < e && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r'))
        s++;
    j->s = s;
}

/* The bytes a string's scan stops at: its closing quote, an escape, and the control
 * characters JSON does not allow raw. */
#define STOP8(b) [b] = 1, [b + 1] = 1, [b + 2] = 1, [b + 3] = 1, [b + 4] = 1, [b + 5] = 1, \
                 [b + 6] = 1, [b + 7] = 1
static const unsigned char str_stop[256] = {STOP8(0), STOP8(8), STOP8(16), STOP8(24),
                                            ['"'] = 1, ['\\'] = 1};
#undef STOP8

static int is_hex(char h)
{
    return (h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F');
}

/* Scans the string at j->s (its quotes included): 0, or -1 when it is not one. The plain
 * bytes between escapes are skipped in a tight loop over a local pointer: most of an
 * answer's bytes are in strings. */
static int scan_string(jscan *j)
{
    const char *s = j->s, *e = j->e;
    if (s >= e || *s != '"') return -1;
    s++;
    for (;;) {
        while (s < e && !str_stop[(unsigned char)*s])
            s++;
        if (s >= e) return -1;
        if (*s == '"') {
            j->s = s + 1;
            return 0;
        }
        if (*s != '\\' || ++s >= e) return -1; /* a raw control character, or a lone \ */
        switch (*s) {
        case 'u':
            if (e - s < 5 || !is_hex(s[1]) || !is_hex(s[2]) || !is_hex(s[3]) || !is_hex(s[4]))
                return -1;
            s += 5;
            break;
        case '"':
        case '\\':
        case '/':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
            s++;
            break;
        default:
            return -1;
        }
    }
}

static int scan_value(jscan *j);

static const char *digits(const char *s, const char *e)
{
    while (s < e && *s >= '0' && *s <= '9')
        s++;
    return s;
}

static int scan_number(jscan *j)
{
    const char *s = j->s, *e = j->e, *d;
    if (s < e && *s == '-') s++;
    if (s >= e) return -1;
    if (*s == '0')
        s++;
    else if (*s >= '1' && *s <= '9')
        s = digits(s, e);
    else
        return -1;
    if (s < e && *s == '.') {
        d = ++s;
        if ((s = digits(s, e)) == d) return -1;
    }
    if (s < e && (*s == 'e' || *s == 'E')) {
        s++;
        if (s < e && (*s == '+' || *s == '-')) s++;
        d = s;
        if ((s = digits(s, e)) == d) return -1;
    }
    j->s = s;
    return 0;
}

static int scan_lit(jscan *j, const char *lit, size_t n)
{
    if ((size_t)(j->e - j->s) < n || memcmp(j->s, lit, n) != 0) return -1;
    j->s += n;
    return 0;
}

/* The bytes skip_value stops at inside a container: quotes and brackets. */
static const unsigned char skip_stop[256] = {['"'] = 1, ['{'] = 1, ['}'] = 1, ['['] = 1,
                                             [']'] = 1};
/* The bytes that end a number or literal: separators, closers and whitespace. */
static const unsigned char scalar_end[256] = {[','] = 1, ['}'] = 1, [']'] = 1, [' '] = 1,
                                              ['\t'] = 1, ['\n'] = 1, ['\r'] = 1, [':'] = 1};

/* The string at s (its opening quote): the byte past its closing quote, or NULL when the text
 * ends first. */
static const char *skip_string(const char *s, const char *e)
{
    for (s++; s < e; s++) {
        if (*s == '\\')
            s++;
        else if (*s == '"')
            return s + 1;
    }
    return NULL;
}

/* Delimits the value at j->s in text validated before (j->trusted): a container by counting
 * its brackets outside strings, a string by its closing quote, a scalar up to the next
 * separator. Never reads outside [j->s, j->e); on text that is not valid JSON the value it
 * delimits is unspecified (-1 when the text ends inside it). */
static int skip_value(jscan *j)
{
    const char *s = j->s, *e = j->e;
    if (*s == '"') {
        if (!(s = skip_string(s, e))) return -1;
    } else if (*s == '{' || *s == '[') {
        int depth = 0;
        for (;; s++) {
            while (s < e && !skip_stop[(unsigned char)*s])
                s++;
            if (s >= e) return -1;
            if (*s == '"') {
                if (!(s = skip_string(s, e))) return -1;
                s--; /* the loop's s++ steps past the closing quote */
            } else if (*s == '{' || *s == '[') {
                depth++;
            } else if (--depth == 0) {
                s++;
                break;
            }
        }
    } else {
        const char *b = s;
        while (s < e && !scalar_end[(unsigned char)*s])
            s++;
        if (s == b) return -1;
    }
    j->s = s;
    return 0;
}

/* Scans one value (containers recursively, at most 512 deep). */
static int scan_value(jscan *j)
{
    ws(j);
    if (j->s >= j->e) return -1;
    if (j->trusted) return skip_value(j);
    char c = *j->s;
    if (c == '{' || c == '[') {
        if (++j->depth > 512) return -1;
        char close = c == '{' ? '}' : ']';
        j->s++;
        ws(j);
        if (j->s < j->e && *j->s == close) {
            j->s++;
            j->depth--;
            return 0;
        }
        for (;;) {
            if (c == '{') {
                ws(j);
                if (scan_string(j)) return -1;
                ws(j);
                if (j->s >= j->e || *j->s != ':') return -1;
                j->s++;
            }
            ws(j);
            if (j->s >= j->e) return -1;
            /* scalars inline: most values in an answer are short strings and numbers */
            char v = *j->s;
            if (v == '"' ? scan_string(j) : (v == '-' || (v >= '0' && v <= '9')) ? scan_number(j)
                                                                                  : scan_value(j))
                return -1;
            ws(j);
            if (j->s >= j->e) return -1;
            if (*j->s == ',') {
                j->s++;
                continue;
            }
            if (*j->s == close) {
                j->s++;
                j->depth--;
                return 0;
            }
            return -1;
        }
    }
    if (c == '"') return scan_string(j);
    if (c == 't') return scan_lit(j, "true", 4);
    if (c == 'f') return scan_lit(j, "false", 5);
    if (c == 'n') return scan_lit(j, "null", 4);
    return scan_number(j);
}

typedef struct jedit {
    size_t start, end; /* bytes [start, end) replaced */
    const char *repl;  /* "" or "null" */
} jedit;

#define JEDITS_MAX 512

typedef struct jedits {
    jedit e[JEDITS_MAX];
    size_t n;
} jedits;

static int in_list(const char *const *list, const char *k, size_t kn)
{
    for (size_t i = 0; list && list[i]; i++)
        if (strlen(list[i]) == kn && memcmp(list[i], k, kn) == 0) return 1;
    return 0;
}

static int add_edit(jedits *ed, size_t s, size_t e, const char *repl)
{
    if (ed->n >= JEDITS_MAX) return -1;
    ed->e[ed->n++] = (jedit){s, e, repl};
    return 0;
}

static int key_is(const char *ks, size_t kn, const char *want);

/* key_is, where plain says whether the key has no escapes (nearly all): then it is compared
 * as it is, first byte first. */
static int key_matches(const char *ks, size_t kn, int plain, const char *want)
{
    if (!plain) return key_is(ks, kn, want);
    return want[0] == ks[0] && !strncmp(want, ks, kn) && !want[kn];
}

/* Walks the object at j->s, deleting members named in `remove` and nulling those in `nul`;
 * `on_choices` (top level only) descends into the "choices" array. Member deletion takes
 * the separating comma with it so the result stays valid JSON. */
static int walk_object(jscan *j, const char *base, const char *const *remove,
                       const char *const *nul, const al_json_strip *spec, int top, jedits *ed)
{
    ws(j);
    if (j->s >= j->e || *j->s != '{') return -1;
    j->s++;
    ws(j);
    if (j->s < j->e && *j->s == '}') {
        j->s++;
        return 0;
    }
    int kept_before = 0;
    size_t prev_end = 0;
    for (;;) {
        ws(j);
        size_t mstart = (size_t)(j->s - base);
        const char *ks = j->s + 1;
        if (scan_string(j)) return -1;
        size_t kn = (size_t)(j->s - ks) - 1;
        ws(j);
        if (j->s >= j->e || *j->s != ':') return -1;
        j->s++;
        ws(j);
        size_t vstart = (size_t)(j->s - base);
        int is_choices =
            top && kn == 7 && memcmp(ks, "choices", 7) == 0 && j->s < j->e && *j->s == '[';
        if (top && spec->first_choice && (is_choices || key_is(ks, kn, "choices")))
            *spec->first_choice = (al_slice){NULL, 0}; /* a later "choices" replaces it */
        if (is_choices) {
            /* each element: an object walked with the choice lists, else scanned */
            j->s++;
            ws(j);
            if (j->s < j->e && *j->s == ']')
                j->s++;
            else
                for (size_t nth = 0;; nth++) {
                    ws(j);
                    if (j->s < j->e && *j->s == '{') {
                        const char *cs = j->s;
                        if (walk_object(j, base, spec->choice_remove, spec->choice_null, spec, 0,
                                        ed))
                            return -1;
                        if (spec->first_choice && !spec->first_choice->p && !nth)
                            *spec->first_choice = (al_slice){cs, (size_t)(j->s - cs)};
                    } else if (scan_value(j)) {
                        return -1;
                    }
                    ws(j);
                    if (j->s >= j->e) return -1;
                    if (*j->s == ',') {
                        j->s++;
                        continue;
                    }
                    if (*j->s == ']') {
                        j->s++;
                        break;
                    }
                    return -1;
                }
        } else if (scan_value(j)) {
            return -1;
        }
        size_t mend = (size_t)(j->s - base);
        if (top && spec->top_find) {
            int plain = kn && !memchr(ks, '\\', kn);
            for (size_t i = 0; spec->top_find[i]; i++)
                if (key_matches(ks, kn, plain, spec->top_find[i])) {
                    spec->top_found[i] = (al_slice){base + vstart, mend - vstart};
                    break;
                }
        }
        ws(j);
        if (j->s >= j->e) return -1;
        int last = *j->s == '}';
        if (!last && *j->s != ',') return -1;
        size_t next_start = 0;
        if (!last) {
            const char *save = j->s;
            j->s++;
            ws(j);
            next_start = (size_t)(j->s - base);
            j->s = save;
        }
        if (in_list(remove, ks, kn)) {
            int r;
            if (kept_before)
                r = add_edit(ed, prev_end, mend, "");
            else if (!last)
                r = add_edit(ed, mstart, next_start, "");
            else
                r = add_edit(ed, mstart, mend, "");
            if (r) return -1;
        } else {
            if (in_list(nul, ks, kn) &&
                !(mend - vstart == 4 && memcmp(base + vstart, "null", 4) == 0))
                if (add_edit(ed, vstart, mend, "null")) return -1;
            kept_before = 1;
        }
        prev_end = mend;
        j->s++;
        if (last) return 0;
    }
}

long al_json_strip_apply(const char *in, size_t len, const al_json_strip *spec, char *out,
                         size_t outcap)
{
    jedits *ed = malloc(sizeof *ed);
    if (!ed) return -1;
    ed->n = 0;
    jscan j = {in, in + len, 0, 0};
    long res = -1;
    for (size_t i = 0; spec->top_find && spec->top_find[i]; i++)
        spec->top_found[i] = (al_slice){NULL, 0};
    if (spec->first_choice) *spec->first_choice = (al_slice){NULL, 0};
    if (walk_object(&j, in, spec->top_remove, spec->top_null, spec, 1, ed) == 0) {
        ws(&j);
        if (j.s == j.e) {
            /* edits come in text order except nested ones, which never overlap */
            size_t o = 0, pos = 0;
            /* sort by start (few edits: insertion sort) */
            for (size_t a = 1; a < ed->n; a++)
                for (size_t b = a; b > 0 && ed->e[b - 1].start > ed->e[b].start; b--) {
                    jedit t = ed->e[b];
                    ed->e[b] = ed->e[b - 1];
                    ed->e[b - 1] = t;
                }
            int ok = 1;
            for (size_t k = 0; k < ed->n && ok; k++) {
                jedit *x = &ed->e[k];
                if (x->start < pos) { /* inside a deleted member: already gone */
                    if (x->end > pos) pos = x->end;
                    continue;
                }
                size_t keep = x->start - pos, rl = strlen(x->repl);
                if (o + keep + rl > outcap)
                    ok = 0;
                else {
                    memcpy(out + o, in + pos, keep);
                    o += keep;
                    memcpy(out + o, x->repl, rl);
                    o += rl;
                    pos = x->end;
                }
            }
            if (ok && o + (len - pos) <= outcap) {
                memcpy(out + o, in + pos, len - pos);
                o += len - pos;
                res = (long)o;
            }
        }
    }
    free(ed);
    return res;
}

int al_json_valid(const char *in, size_t n)
{
    jscan j = {in, in + n, 0, 0};
    if (scan_value(&j)) return 0;
    ws(&j);
    return j.s == j.e;
}

/* Several keys in one pass (al_json_member is the one-key case): the members after the
 * first wanted one are not scanned again for each key. */
/* Whether the raw key text ks[0..kn) (between its quotes) means `want`, an ASCII name: escapes
 * are decoded as a JSON parser decodes them ("stre\u0061m" is "stream"). */
static int key_is(const char *ks, size_t kn, const char *want)
{
    size_t wl = strlen(want);
    if (!memchr(ks, '\\', kn)) return kn == wl && memcmp(ks, want, kn) == 0;
    size_t w = 0;
    for (size_t i = 0; i < kn; i++, w++) {
        char c = ks[i];
        if (c == '\\' && i + 1 < kn) {
            char x = ks[++i];
            if (x == 'u') {
                if (i + 4 >= kn) return 0;
                unsigned v = 0;
                for (int k = 1; k <= 4; k++) {
                    char h = ks[i + k];
                    v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0'
                                           : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                                                  : h - 'A' + 10);
                }
                i += 4;
                if (v >= 0x80) return 0; /* the names looked for are ASCII */
                c = (char)v;
            } else {
                c = x == 'n' ? '\n' : x == 't' ? '\t' : x == 'r' ? '\r' : x == 'b' ? '\b'
                    : x == 'f' ? '\f' : x;
            }
        }
        if (w >= wl || want[w] != c) return 0;
    }
    return w == wl;
}

/* The object at j->s, its members read into vals (see al_json_members); j->s ends past its
 * closing brace. Every member is read (the object is scanned to its end): when a key comes
 * twice the last one wins, as it does for jansson, Python and the upstreams, so that no reader
 * of a request sees another value than the others do. */
static int members_scan(jscan *j, const char *const *keys, al_slice *vals, size_t nkeys)
{
    int found = 0;
    for (size_t i = 0; i < nkeys; i++)
        vals[i].p = NULL, vals[i].n = 0;
    ws(j);
    if (j->s >= j->e || *j->s != '{') return -1;
    j->s++;
    ws(j);
    if (j->s < j->e && *j->s == '}') {
        j->s++;
        return 0;
    }
    for (;;) {
        ws(j);
        const char *ks = j->s + 1;
        if (scan_string(j)) return -1;
        size_t kn = (size_t)(j->s - ks) - 1;
        ws(j);
        if (j->s >= j->e || *j->s != ':') return -1;
        j->s++;
        ws(j);
        const char *vs = j->s;
        if (scan_value(j)) return -1;
        int plain = kn && !memchr(ks, '\\', kn);
        for (size_t i = 0; i < nkeys; i++)
            if (key_matches(ks, kn, plain, keys[i])) {
                if (!vals[i].p) found++;
                vals[i].p = vs;
                vals[i].n = (size_t)(j->s - vs);
                break;
            }
        ws(j);
        if (j->s >= j->e) return -1;
        if (*j->s == '}') {
            j->s++;
            return found;
        }
        if (*j->s != ',') return -1;
        j->s++;
    }
}

int al_json_members(const char *in, size_t n, const char *const *keys, al_slice *vals, size_t nkeys)
{
    jscan j = {in, in + n, 0, 0};
    return members_scan(&j, keys, vals, nkeys);
}

int al_json_members_valid(const char *in, size_t n, const char *const *keys, al_slice *vals,
                          size_t nkeys)
{
    jscan j = {in, in + n, 0, 1};
    return members_scan(&j, keys, vals, nkeys);
}

int al_json_member(const char *in, size_t n, const char *key, al_slice *val)
{
    return al_json_members(in, n, &key, val, 1);
}

int al_json_element(const char *in, size_t n, size_t i, al_slice *val)
{
    jscan j = {in, in + n, 0, 0};
    ws(&j);
    if (j.s >= j.e || *j.s != '[') return -1;
    j.s++;
    ws(&j);
    if (j.s < j.e && *j.s == ']') return 0;
    for (size_t k = 0;; k++) {
        ws(&j);
        const char *vs = j.s;
        if (scan_value(&j)) return -1;
        if (k == i) {
            val->p = vs;
            val->n = (size_t)(j.s - vs);
            return 1;
        }
        ws(&j);
        if (j.s >= j.e) return -1;
        if (*j.s == ']') return 0;
        if (*j.s != ',') return -1;
        j.s++;
    }
}

int al_json_iter_init(al_json_iter *it, const char *in, size_t n)
{
    jscan j = {in, in + n, 0, 0};
    ws(&j);
    if (j.s >= j.e || *j.s != '[') return -1;
    it->s = j.s + 1;
    it->e = j.e;
    it->first = 1;
    it->trusted = 0;
    return 0;
}

int al_json_iter_init_valid(al_json_iter *it, const char *in, size_t n)
{
    if (al_json_iter_init(it, in, n) != 0) return -1;
    it->trusted = 1;
    return 0;
}

/* Moves j past the separator before the iterator's next element: 1 at that element, 0 at
 * the array's end (it->s there), -1 on malformed text. */
static int iter_step(al_json_iter *it, jscan *j)
{
    ws(j);
    if (j->s >= j->e) return -1;
    if (*j->s == ']') {
        it->s = j->s;
        return 0;
    }
    if (!it->first) {
        if (*j->s != ',') return -1;
        j->s++;
        ws(j);
    }
    return 1;
}

int al_json_iter_next(al_json_iter *it, al_slice *val)
{
    jscan j = {it->s, it->e, 0, it->trusted};
    int at = iter_step(it, &j);
    if (at <= 0) return at;
    const char *vs = j.s;
    if (scan_value(&j)) return -1;
    val->p = vs;
    val->n = (size_t)(j.s - vs);
    it->s = j.s;
    it->first = 0;
    return 1;
}

int al_json_iter_next_members(al_json_iter *it, const char *const *keys, al_slice *vals,
                              size_t nkeys, al_slice *val)
{
    jscan j = {it->s, it->e, 0, it->trusted};
    int at = iter_step(it, &j);
    if (at <= 0) return at;
    const char *vs = j.s;
    int rc = 1;
    if (j.s < j.e && *j.s == '{') {
        if (members_scan(&j, keys, vals, nkeys) < 0) return -1;
    } else {
        for (size_t i = 0; i < nkeys; i++)
            vals[i].p = NULL, vals[i].n = 0;
        if (scan_value(&j)) return -1;
        rc = 2;
    }
    val->p = vs;
    val->n = (size_t)(j.s - vs);
    it->s = j.s;
    it->first = 0;
    return rc;
}
