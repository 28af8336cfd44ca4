/*
 * hash.h: the one string hash and the one pseudo-random generator.
 *
 * al_hash_fnv1a is 64-bit FNV-1a: stable across runs and machines, so what is derived from
 * it (a task's shuffle order, a dedupe key, a token's slot) replays byte for byte. Its offset
 * basis is 1469598103934665603, not the standard's 14695981039346656037: every copy the
 * project had used that value, and recorded runs' task orders derive from it, so it stays.
 * Its low bits are weak; a hash table indexes by al_hash_mix of it.
 * al_splitmix64 is Steele, Lea and Flood's SplitMix64: a 64-bit state stepped by the golden
 * ratio, each output a bijective mix of it; deterministic from its seed.
 */
#ifndef ARCLIGHT_CORE_HASH_H
#define ARCLIGHT_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

#define AL_FNV1A_BASIS 1469598103934665603ULL
#define AL_FNV1A_PRIME 1099511628211ULL

/* FNV-1a of n bytes, continuing from h (AL_FNV1A_BASIS to start). */
static inline uint64_t al_hash_fnv1a_more(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * AL_FNV1A_PRIME;
    return h;
}

static inline uint64_t al_hash_fnv1a(const void *p, size_t n)
{
    return al_hash_fnv1a_more(AL_FNV1A_BASIS, p, n);
}

/* FNV-1a of a NUL-terminated string. */
static inline uint64_t al_hash_str(const char *s)
{
    uint64_t h = AL_FNV1A_BASIS;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * AL_FNV1A_PRIME;
    return h;
}

/* SplitMix64's output function: a bijective mix whose every output bit depends on every
 * input bit (the finaliser a table index wants after FNV). */
static inline uint64_t al_hash_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The next SplitMix64 output of the state *x (which it advances). */
static inline uint64_t al_splitmix64(uint64_t *x)
{
    return al_hash_mix(*x += 0x9e3779b97f4a7c15ULL);
}

#endif
