/*
 * tracker.c: per-partition offset tracker. Inputs arrive in offset order; each carries a
 * count of outputs not yet acknowledged. Finished inputs at the front are popped and the
 * committable offset becomes one past the last popped; a pending input at the front holds it.
 * A ring buffer of (offset, pending), binary-searched by offset.
 */
#include "kafka/kafka.h"

#include <stdlib.h>

typedef struct tracker_entry {
    int64_t offset;
    int pending;
} tracker_entry;

struct al_offset_tracker {
    tracker_entry *ring;
    size_t cap, head, n; /* n entries starting at head (mod cap) */
    int64_t last_added;  /* -1 before the first add */
    int64_t committable; /* -1 before anything finished */
    size_t npending;
};

al_offset_tracker *al_offset_tracker_new(void)
{
    al_offset_tracker *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->last_added = -1;
    t->committable = -1;
    return t;
}

void al_offset_tracker_free(al_offset_tracker *t)
{
    if (!t) return;
    free(t->ring);
    free(t);
}

static tracker_entry *entry_at(const al_offset_tracker *t, size_t i)
{
    return &t->ring[(t->head + i) % t->cap];
}

/* Pops finished entries off the front, moving the committable offset past them. */
static void tracker_advance(al_offset_tracker *t)
{
    while (t->n > 0) {
        tracker_entry *e = entry_at(t, 0);
        if (e->pending > 0) {
            t->committable = e->offset;
            return;
        }
        t->committable = e->offset + 1;
        t->head = (t->head + 1) % t->cap;
        t->n--;
    }
}

static int tracker_grow(al_offset_tracker *t)
{
    size_t cap = t->cap ? t->cap * 2 : 64;
    tracker_entry *r = malloc(cap * sizeof *r);
    if (!r) return -1;
    for (size_t i = 0; i < t->n; i++)
        r[i] = *entry_at(t, i);
    free(t->ring);
    t->ring = r;
    t->cap = cap;
    t->head = 0;
    return 0;
}

int al_offset_tracker_add(al_offset_tracker *t, int64_t offset, int pending)
{
    if (offset < 0 || offset <= t->last_added || pending < 0) return -1;
    t->last_added = offset;
    if (pending == 0 && t->n == 0) {
        t->committable = offset + 1;
        return 0;
    }
    if (t->n == t->cap && tracker_grow(t) != 0) return -1;
    tracker_entry *e = &t->ring[(t->head + t->n) % t->cap];
    e->offset = offset;
    e->pending = pending;
    t->n++;
    if (pending > 0) t->npending++;
    tracker_advance(t);
    return 0;
}

/* Index of offset among the tracked entries (sorted), or -1. */
static long tracker_find(const al_offset_tracker *t, int64_t offset)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int64_t o = entry_at(t, mid)->offset;
        if (o == offset) return (long)mid;
        if (o < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

int al_offset_tracker_inc(al_offset_tracker *t, int64_t offset)
{
    long i = tracker_find(t, offset);
    if (i < 0) return -1;
    tracker_entry *e = entry_at(t, (size_t)i);
    if (e->pending <= 0) return -1;
    e->pending++;
    return 0;
}

int al_offset_tracker_ack(al_offset_tracker *t, int64_t offset)
{
    long i = tracker_find(t, offset);
    if (i < 0) return -1;
    tracker_entry *e = entry_at(t, (size_t)i);
    if (e->pending <= 0) return -1;
    if (--e->pending == 0) {
        t->npending--;
        if (i == 0) tracker_advance(t);
    }
    return 0;
}

int64_t al_offset_tracker_committable(const al_offset_tracker *t)
{
    return t->committable;
}

size_t al_offset_tracker_pending(const al_offset_tracker *t)
{
    return t->npending;
}
