/*
 * vec.h: the one growable array, typed by a macro: AL_VEC(int64_t) is a struct of v (the
 * elements, malloc'd), n (how many) and cap. Zero-initialise; free with al_vec_free.
 *
 *   AL_VEC(rollout *) live = {0};
 *   if (al_vec_push(&live, r) != 0) ...out of memory...
 */
#ifndef ARCLIGHT_CORE_VEC_H
#define ARCLIGHT_CORE_VEC_H

#include <stddef.h>
#include <stdlib.h>

#define AL_VEC(T)                                                                                  \
    struct {                                                                                       \
        T *v;                                                                                      \
        size_t n, cap;                                                                             \
    }

/* Makes *cap (a count of elem-byte elements in *arr) at least need, doubling from 16;
 * 0, or -1 on overflow or when out of memory (*arr and *cap unchanged). */
int al_vec_grow(void **arr, size_t *cap, size_t need, size_t elem);

/* Room for extra more elements; 0 or -1. */
#define al_vec_reserve(vec, extra)                                                                 \
    al_vec_grow((void **)&(vec)->v, &(vec)->cap, (vec)->n + (extra), sizeof *(vec)->v)
/* Appends x; 0 or -1 (nothing appended). */
#define al_vec_push(vec, x) (al_vec_reserve(vec, 1) ? -1 : ((vec)->v[(vec)->n++] = (x), 0))
#define al_vec_free(vec) (free((vec)->v), (vec)->v = NULL, (vec)->n = (vec)->cap = 0)

#endif
