/*
 * buf.c: the growable byte buffer (buf.h) and the growth of the typed vector (vec.h).
 */
#include "core/buf.h"
#include "core/vec.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void al_buf_init(al_buf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->oom = 0;
}

void al_buf_free(al_buf *b)
{
    free(b->data);
    al_buf_init(b);
}

void al_buf_reset(al_buf *b)
{
    b->len = 0;
    b->oom = 0;
    if (b->data) b->data[0] = '\0';
}

/* Grows geometrically so that appending a few bytes at a time stays amortised O(n). */
int al_buf_reserve(al_buf *b, size_t n)
{
    if (b->oom) return -1;
    if (b->cap > b->len && b->cap - b->len - 1 >= n) return 0;
    if (n > SIZE_MAX / 2 - b->len - 1) {
        b->oom = 1;
        return -1;
    }
    size_t want = b->len + n + 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < want) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) {
        b->oom = 1;
        return -1;
    }
    b->data = d;
    b->cap = cap;
    return 0;
}

int al_buf_append(al_buf *b, const void *data, size_t n)
{
    if (al_buf_reserve(b, n)) return -1;
    if (n) memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int al_buf_puts(al_buf *b, const char *s)
{
    return al_buf_append(b, s, strlen(s));
}

int al_buf_printf(al_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || al_buf_reserve(b, (size_t)n)) return -1;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

char *al_buf_detach(al_buf *b, size_t *len_out)
{
    if (!b->data && al_buf_reserve(b, 0) == 0) b->data[0] = '\0';
    char *d = b->data;
    if (len_out) *len_out = b->len;
    al_buf_init(b);
    return d;
}

int al_vec_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2) return -1;
        nc *= 2;
    }
    if (elem && nc > SIZE_MAX / elem) return -1;
    void *p = realloc(*arr, nc * elem);
    if (!p) return -1;
    *arr = p;
    *cap = nc;
    return 0;
}
