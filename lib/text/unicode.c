/*
 * unicode.c: UTF-8 coding, character classes and NFC over the generated tables in
 * unicode_tables.c. Everything here is pure and thread-safe.
 */
#include "text/unicode.h"

#include <stdlib.h>
#include <string.h>

enum {
    HANGUL_SBASE = 0xAC00,
    HANGUL_LBASE = 0x1100,
    HANGUL_VBASE = 0x1161,
    HANGUL_TBASE = 0x11A7,
    HANGUL_LCOUNT = 19,
    HANGUL_VCOUNT = 21,
    HANGUL_TCOUNT = 28,
    HANGUL_NCOUNT = HANGUL_VCOUNT * HANGUL_TCOUNT,
    HANGUL_SCOUNT = HANGUL_LCOUNT * HANGUL_NCOUNT,
};

static const al_unicode_range *range_find(const al_unicode_range *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].lo)
            hi = mid;
        else if (cp > r[mid].hi)
            lo = mid + 1;
        else
            return &r[mid];
    }
    return NULL;
}

/* ASCII is most of what a tokenizer sees: answer it from a small table. */
static unsigned ascii_class(uint32_t cp)
{
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return AL_UNICODE_LETTER;
    if (cp >= '0' && cp <= '9') return AL_UNICODE_NUMBER;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return AL_UNICODE_SPACE;
    return 0;
}

unsigned al_unicode_class(uint32_t cp)
{
    if (cp < 0x80) return ascii_class(cp);
    if (cp > 0x10FFFF) return 0;
    const al_unicode_range *r =
        range_find(al_unicode_class_ranges, al_unicode_class_ranges_count, cp);
    return r ? r->value : 0;
}

unsigned al_unicode_ccc(uint32_t cp)
{
    if (cp < 0x300 || cp > 0x10FFFF) return 0;
    const al_unicode_range *r = range_find(al_unicode_ccc_ranges, al_unicode_ccc_ranges_count, cp);
    return r ? r->value : 0;
}

size_t al_utf8_decode(const uint8_t *s, size_t len, uint32_t *cp)
{
    uint8_t b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    size_t n;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    uint32_t v;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        n = 2;
        v = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        n = 3;
        v = b0 & 0x0F;
        if (b0 == 0xE0) lo = 0xA0; /* overlong */
        if (b0 == 0xED) hi = 0x9F; /* surrogates */
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        n = 4;
        v = b0 & 0x07;
        if (b0 == 0xF0) lo = 0x90; /* overlong */
        if (b0 == 0xF4) hi = 0x8F; /* past U+10FFFF */
    } else {
        goto bad;
    }
    if (len < n || s[1] < lo || s[1] > hi) goto bad;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) goto bad;
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return n;
bad:
    *cp = AL_UNICODE_BAD_BYTE | b0;
    return 1;
}

size_t al_utf8_encode(uint32_t cp, uint8_t *out)
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

size_t al_utf8_complete_prefix(const uint8_t *s, size_t len)
{
    /* Look back at most 3 bytes for the lead byte of an unfinished sequence. */
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        size_t i = len - back;
        uint8_t b = s[i];
        if ((b & 0xC0) == 0x80) continue; /* continuation: keep looking */
        size_t need = 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) {
            need = 2;
        } else if (b >= 0xE0 && b <= 0xEF) {
            need = 3;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 4;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        }
        if (need <= back) return len; /* ASCII, a bad byte, or a finished sequence */
        /* Unfinished: hold it back only if what is there could still become valid. */
        if (back >= 2 && (s[i + 1] < lo || s[i + 1] > hi)) return len;
        if (back >= 3 && (s[i + 2] & 0xC0) != 0x80) return len;
        return i;
    }
    return len;
}

/* ------------------------------------------------------------------------------------ */
/* NFC                                                                                  */

typedef struct cpvec {
    uint32_t *v;
    size_t n, cap;
} cpvec;

static int cpvec_push(cpvec *c, uint32_t cp)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        uint32_t *v = realloc(c->v, cap * sizeof *v);
        if (!v) return -1;
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = cp;
    return 0;
}

static const al_unicode_triple *decomposition_of(uint32_t cp)
{
    size_t lo = 0, hi = al_unicode_decompositions_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint32_t k = al_unicode_decompositions[mid].a;
        if (cp < k)
            hi = mid;
        else if (cp > k)
            lo = mid + 1;
        else
            return &al_unicode_decompositions[mid];
    }
    return NULL;
}

static int decompose(uint32_t cp, cpvec *out, int depth)
{
    if (cp >= HANGUL_SBASE && cp < HANGUL_SBASE + HANGUL_SCOUNT) {
        uint32_t s = cp - HANGUL_SBASE;
        if (cpvec_push(out, HANGUL_LBASE + s / HANGUL_NCOUNT)) return -1;
        if (cpvec_push(out, HANGUL_VBASE + (s % HANGUL_NCOUNT) / HANGUL_TCOUNT)) return -1;
        if (s % HANGUL_TCOUNT && cpvec_push(out, HANGUL_TBASE + s % HANGUL_TCOUNT)) return -1;
        return 0;
    }
    const al_unicode_triple *d =
        (cp >= 0xC0 && cp <= 0x10FFFF && depth < 8) ? decomposition_of(cp) : NULL;
    if (!d) return cpvec_push(out, cp);
    if (decompose(d->b, out, depth + 1)) return -1;
    return d->c ? decompose(d->c, out, depth + 1) : 0;
}

static uint32_t compose_pair(uint32_t a, uint32_t b)
{
    if (a >= HANGUL_LBASE && a < HANGUL_LBASE + HANGUL_LCOUNT && b >= HANGUL_VBASE &&
        b < HANGUL_VBASE + HANGUL_VCOUNT)
        return HANGUL_SBASE +
               ((a - HANGUL_LBASE) * HANGUL_VCOUNT + (b - HANGUL_VBASE)) * HANGUL_TCOUNT;
    if (a >= HANGUL_SBASE && a < HANGUL_SBASE + HANGUL_SCOUNT &&
        (a - HANGUL_SBASE) % HANGUL_TCOUNT == 0 && b > HANGUL_TBASE &&
        b < HANGUL_TBASE + HANGUL_TCOUNT)
        return a + (b - HANGUL_TBASE);
    size_t lo = 0, hi = al_unicode_compositions_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const al_unicode_triple *t = &al_unicode_compositions[mid];
        if (a < t->a || (a == t->a && b < t->b))
            hi = mid;
        else if (a > t->a || b > t->b)
            lo = mid + 1;
        else
            return t->c;
    }
    return 0;
}

static int nfc_unsafe(uint32_t cp)
{
    if (cp < 0x300 || cp > 0x10FFFF) return 0;
    return range_find(al_unicode_nfc_unsafe, al_unicode_nfc_unsafe_count, cp) != NULL;
}

/* The full algorithm of UAX #15: decompose, order marks canonically, recompose. Called
 * only for text that holds at least one NFC-unsafe character. */
int al_unicode_nfc(const char *text, size_t len, char **out, size_t *out_len)
{
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0;
    int unsafe = 0;
    while (i < len && !unsafe) {
        uint32_t cp;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        i += al_utf8_decode(s + i, len - i, &cp);
        unsafe = nfc_unsafe(cp);
    }
    if (!unsafe) return 0;

    cpvec d = {0};
    for (i = 0; i < len;) {
        uint32_t cp;
        i += al_utf8_decode(s + i, len - i, &cp);
        if (decompose(cp, &d, 0)) goto oom;
    }
    /* Canonical ordering: a stable sort of each run of non-starters by combining class. */
    for (size_t k = 1; k < d.n; k++) {
        unsigned c = al_unicode_ccc(d.v[k]);
        if (c == 0) continue;
        size_t j = k;
        uint32_t cp = d.v[k];
        while (j > 0) {
            unsigned pc = al_unicode_ccc(d.v[j - 1]);
            if (pc <= c) break;
            d.v[j] = d.v[j - 1];
            j--;
        }
        d.v[j] = cp;
    }
    /* Recompose in place. */
    size_t n = 0;
    long starter = -1;
    unsigned last_cc = 0;
    for (size_t k = 0; k < d.n; k++) {
        uint32_t cp = d.v[k];
        unsigned cc = al_unicode_ccc(cp);
        if (starter >= 0 && (last_cc == 0 ? (n == (size_t)starter + 1) : last_cc < cc)) {
            uint32_t comp = compose_pair(d.v[starter], cp);
            if (comp) {
                d.v[starter] = comp;
                continue;
            }
        }
        if (cc == 0) {
            starter = (long)n;
            last_cc = 0;
        } else {
            last_cc = cc;
        }
        d.v[n++] = cp;
    }
    char *o = malloc(n * 4 + 1);
    if (!o) goto oom;
    size_t olen = 0;
    for (size_t k = 0; k < n; k++) {
        if (d.v[k] & AL_UNICODE_BAD_BYTE)
            o[olen++] = (char)(d.v[k] & 0xFF);
        else
            olen += al_utf8_encode(d.v[k], (uint8_t *)o + olen);
    }
    o[olen] = 0;
    free(d.v);
    *out = o;
    *out_len = olen;
    return 1;
oom:
    free(d.v);
    return -1;
}
