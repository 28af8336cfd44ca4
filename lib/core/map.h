/*
 * map.h: the one string-keyed hash map (the proxy's rollout and session tables, the rollout
 * controller's table, credit's and batch's tables).
 *
 * Chained, power-of-two slots indexed by al_hash_mix(FNV-1a) of the key, doubled when the
 * count passes the slot count. Each entry holds a copy of its key (any bytes, NUL-terminated
 * for convenience) and a void * value the map does not own. Entries do not move: a pointer
 * to one stays good until it is removed. Zero-initialise a map (or al_map_init).
 */
#ifndef ARCLIGHT_CORE_MAP_H
#define ARCLIGHT_CORE_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct al_map_entry {
    struct al_map_entry *next;
    uint64_t hash;
    void *value;
    size_t klen;
    char key[]; /* klen bytes and a NUL */
} al_map_entry;

typedef struct al_map {
    al_map_entry **slots;
    size_t nslots; /* 0 or a power of two */
    size_t count;
} al_map;

void al_map_init(al_map *m);
/* Frees every entry (and, when free_value is given, each value with it). */
void al_map_free(al_map *m, void (*free_value)(void *));

/* The entry of key[0..klen), or NULL. */
al_map_entry *al_map_findn(const al_map *m, const char *key, size_t klen);
al_map_entry *al_map_find(const al_map *m, const char *key);
/* The value of key, or NULL (also for a key whose value is NULL). */
void *al_map_get(const al_map *m, const char *key);

/* The entry of key, made (value NULL, *created 1) when absent; NULL when out of memory. */
al_map_entry *al_map_upsertn(al_map *m, const char *key, size_t klen, int *created);
/* Sets key's value, adding the key when absent; 0, or -1 when out of memory. */
int al_map_put(al_map *m, const char *key, void *value);

/* Unlinks and frees an entry of m (from al_map_find or an iteration) and returns its value. */
void *al_map_remove_entry(al_map *m, al_map_entry *e);
/* Removes key; its value, or NULL when absent. */
void *al_map_remove(al_map *m, const char *key);

/* Iteration in no particular order. The entry just returned may be removed (and nothing
 * else) before the next call; nothing may be added during an iteration. */
typedef struct al_map_iter {
    const al_map *m;
    size_t slot;
    al_map_entry *next;
} al_map_iter;
void al_map_iter_init(al_map_iter *it, const al_map *m);
al_map_entry *al_map_iter_next(al_map_iter *it);

#endif
