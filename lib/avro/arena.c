/*
 * arena.c: the block arena that decoded messages own their strings and arrays in (encoders
 * write into lib/core's al_buf).
 */
#include "avro/codec.h"

#include <stdlib.h>
#include <string.h>

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
