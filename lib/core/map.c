/*
 * map.c: the string-keyed hash map (map.h).
 */
#include "core/map.h"

#include "core/hash.h"

#include <stdlib.h>
#include <string.h>

static uint64_t key_hash(const char *key, size_t klen)
{
    return al_hash_mix(al_hash_fnv1a(key, klen));
}

void al_map_init(al_map *m)
{
    m->slots = NULL;
    m->nslots = 0;
    m->count = 0;
}

void al_map_free(al_map *m, void (*free_value)(void *))
{
    for (size_t i = 0; i < m->nslots; i++)
        for (al_map_entry *e = m->slots[i], *nx; e; e = nx) {
            nx = e->next;
            if (free_value) free_value(e->value);
            free(e);
        }
    free(m->slots);
    al_map_init(m);
}

al_map_entry *al_map_findn(const al_map *m, const char *key, size_t klen)
{
    if (!m->nslots) return NULL;
    uint64_t h = key_hash(key, klen);
    for (al_map_entry *e = m->slots[h & (m->nslots - 1)]; e; e = e->next)
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0) return e;
    return NULL;
}

al_map_entry *al_map_find(const al_map *m, const char *key)
{
    return al_map_findn(m, key, strlen(key));
}

void *al_map_get(const al_map *m, const char *key)
{
    al_map_entry *e = al_map_find(m, key);
    return e ? e->value : NULL;
}

/* Doubles the slots (64 to start); entries keep their addresses. -1 when out of memory
 * (the map is unchanged and still works, only with longer chains). */
static int grow(al_map *m)
{
    size_t ns = m->nslots ? m->nslots * 2 : 64;
    al_map_entry **nt = calloc(ns, sizeof *nt);
    if (!nt) return -1;
    for (size_t i = 0; i < m->nslots; i++)
        for (al_map_entry *e = m->slots[i], *nx; e; e = nx) {
            nx = e->next;
            size_t b = e->hash & (ns - 1);
            e->next = nt[b];
            nt[b] = e;
        }
    free(m->slots);
    m->slots = nt;
    m->nslots = ns;
    return 0;
}

al_map_entry *al_map_upsertn(al_map *m, const char *key, size_t klen, int *created)
{
    if (created) *created = 0;
    al_map_entry *e = al_map_findn(m, key, klen);
    if (e) return e;
    if (m->count >= m->nslots && grow(m) != 0 && !m->nslots) return NULL;
    if (klen > SIZE_MAX - sizeof *e - 1 || !(e = malloc(sizeof *e + klen + 1))) return NULL;
    e->hash = key_hash(key, klen);
    e->value = NULL;
    e->klen = klen;
    memcpy(e->key, key, klen);
    e->key[klen] = '\0';
    size_t b = e->hash & (m->nslots - 1);
    e->next = m->slots[b];
    m->slots[b] = e;
    m->count++;
    if (created) *created = 1;
    return e;
}

int al_map_put(al_map *m, const char *key, void *value)
{
    al_map_entry *e = al_map_upsertn(m, key, strlen(key), NULL);
    if (!e) return -1;
    e->value = value;
    return 0;
}

void *al_map_remove_entry(al_map *m, al_map_entry *e)
{
    al_map_entry **pp = &m->slots[e->hash & (m->nslots - 1)];
    while (*pp && *pp != e) pp = &(*pp)->next;
    if (!*pp) return NULL;
    *pp = e->next;
    m->count--;
    void *v = e->value;
    free(e);
    return v;
}

void *al_map_remove(al_map *m, const char *key)
{
    al_map_entry *e = al_map_find(m, key);
    return e ? al_map_remove_entry(m, e) : NULL;
}

void al_map_iter_init(al_map_iter *it, const al_map *m)
{
    it->m = m;
    it->slot = 0;
    it->next = NULL;
}

al_map_entry *al_map_iter_next(al_map_iter *it)
{
    while (!it->next) {
        if (it->slot >= it->m->nslots) return NULL;
        it->next = it->m->slots[it->slot++];
    }
    al_map_entry *e = it->next;
    it->next = e->next;
    return e;
}
