/*
 * buf.c: the growable byte buffer that encoders write into, and the block arena that
 * decoded messages own their strings and arrays in.
 */
#include "avro/codec.h"

#include <stdlib.h>
#include <string.h>

void al_buf_init(al_buf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void al_buf_free(al_buf *b)
{
    free(b->data);
    al_buf_init(b);
}

/* Grows geometrically so that appending n bytes at a time stays amortised O(n).
 * Fails (-1) only when the size overflows or malloc fails; b is unchanged then. */
int al_buf_reserve(al_buf *b, size_t n)
{
    if (b->cap - b->len >= n) return 0;
    if (n > SIZE_MAX / 2 - b->len) return -1;
    size_t want = b->len + n;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < want) cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d) return -1;
    b->data = d;
    b->cap = cap;
    return 0;
}

int al_buf_append(al_buf *b, const void *data, size_t n)
{
    if (al_buf_reserve(b, n)) return -1;
    if (n) memcpy(b->data + b->len, data, n);
    b->len += n;
    return 0;
}

struct al_arena_block {
    al_arena_block *next;
    size_t cap;
    size_t used;
    _Alignas(16) unsigned char data[];
};

#define AL_ARENA_MIN_BLOCK 4096

/* Bump allocation in the newest block; a new block at least twice the previous one when
 * it does not fit, so that a message of size n costs O(log n) mallocs the first time and
 * none once the arena has grown to fit (al_arena_reset keeps the largest block). */
void *al_arena_alloc(al_arena *a, size_t n)
{
    if (n > SIZE_MAX - 64) return NULL;
    n = (n + 7) & ~(size_t)7;
    al_arena_block *h = a->head;
    if (h && h->cap - h->used >= n) {
        void *p = h->data + h->used;
        h->used += n;
        return p;
    }
    size_t cap = AL_ARENA_MIN_BLOCK;
    if (h && h->cap <= SIZE_MAX / 4) cap = h->cap * 2;
    if (cap < n) cap = n;
    al_arena_block *nb = malloc(sizeof *nb + cap);
    if (!nb) return NULL;
    nb->next = h;
    nb->cap = cap;
    nb->used = n;
    a->head = nb;
    return nb->data;
}

void al_arena_reset(al_arena *a)
{
    al_arena_block *keep = NULL;
    for (al_arena_block *b = a->head, *next; b; b = next) {
        next = b->next;
        if (!keep || b->cap > keep->cap) {
            free(keep);
            keep = b;
        } else {
            free(b);
        }
    }
    if (keep) {
        keep->next = NULL;
        keep->used = 0;
    }
    a->head = keep;
}

void al_arena_free(al_arena *a)
{
    for (al_arena_block *b = a->head, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    a->head = NULL;
}
