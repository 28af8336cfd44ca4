/*
 * json_edit.h: JSON read and edited on its text, over (pointer, length) slices, without
 * building a tree and without allocating. The proxy's hot path reads a few fields of each
 * request and answer, and removes the fields it asked the upstream for (token ids, logprobs,
 * usage) from the answer without re-serialising it, so the agent gets the upstream's own
 * bytes. Faces untrusted bytes: fuzzed by tests/fuzz/fuzz_proxy_http1.c.
 */
#ifndef ARCLIGHT_PROXY_JSON_EDIT_H
#define ARCLIGHT_PROXY_JSON_EDIT_H

#include <stddef.h>

#include "slice.h"

typedef struct al_json_strip {
    const char *const *top_remove;    /* members of the top-level object to delete */
    const char *const *top_null;      /* members of the top-level object whose value becomes null */
    const char *const *choice_remove; /* members of each object in top-level "choices" */
    const char *const *choice_null;   /* members of each choice whose value becomes null */
    /* Optional, read off in the same pass (slices into the input, valid when the call
     * succeeds): top_found[i] is the value of top-level member top_find[i] (NULL-terminated;
     * names compared with escapes decoded, the last of duplicates, as al_json_members does),
     * {NULL, 0} when absent; *first_choice the first element of the last top-level "choices"
     * array when it is an object, else {NULL, 0}. */
    const char *const *top_find;
    al_slice *top_found;
    al_slice *first_choice;
} al_json_strip;

/* Writes the edited text to out (capacity outcap >= len suffices: edits never grow the
 * text by more than "null" replacing a shorter value, so give len + 64 * choices; the
 * function checks). Returns the output length, or -1 when in is not one valid JSON object
 * or out is too small (then nothing useful is in out). Keys are compared as raw bytes. */
long al_json_strip_apply(const char *in, size_t len, const al_json_strip *spec, char *out,
                         size_t outcap);

/* Lookups over JSON text without building a tree (the hot path reads a few fields of each
 * request and response). None reads outside in[0..n).
 *
 * al_json_valid: 1 when in[0..n) is exactly one JSON value (whitespace around it allowed,
 * nesting at most 512 deep), 0 otherwise.
 * al_json_member: the value of member `key` of the object in[0..n) (keys compared after
 * their escapes are decoded; a key given twice: the last one, as every JSON parser the
 * request meets takes it): 1 with *val, 0 when there is no such member, -1 when in is not an
 * object.
 * al_json_element: the i-th element of the array in[0..n): 1 with *val, 0 when there are
 * fewer elements, -1 when in is not an array. */
int al_json_valid(const char *in, size_t n);
int al_json_member(const char *in, size_t n, const char *key, al_slice *val);
/* Several members of one object in one pass: vals[i] is keys[i]'s value (the last one), or
 * {NULL, 0} when absent. Returns how many were found, or -1 on malformed JSON (or when in is
 * not an object). */
int al_json_members(const char *in, size_t n, const char *const *keys, al_slice *vals,
                    size_t nkeys);
/* al_json_members for text already validated (by al_json_valid, or by an al_json_strip_apply
 * over it that succeeded): the members' values are delimited (brackets counted outside
 * strings) instead of checked again, about three times faster. On text that is not valid
 * JSON it still reads nothing outside in[0..n), but what it finds is unspecified. */
int al_json_members_valid(const char *in, size_t n, const char *const *keys, al_slice *vals,
                          size_t nkeys);
int al_json_element(const char *in, size_t n, size_t i, al_slice *val);

/* Walks the elements of the array in[0..n) in one pass:
 *     al_json_iter it; al_slice v;
 *     if (al_json_iter_init(&it, p, n) == 0) while (al_json_iter_next(&it, &v) == 1) ...
 * init: 0, or -1 when in is not an array; next: 1 with *val, 0 at the end, -1 on bad input. */
typedef struct al_json_iter {
    const char *s, *e;
    int first;
    int trusted; /* set by al_json_iter_init_valid */
} al_json_iter;
int al_json_iter_init(al_json_iter *it, const char *in, size_t n);
/* An iterator over an array in validated text: its elements (and the members
 * al_json_iter_next_members reads) are delimited as al_json_members_valid does. */
int al_json_iter_init_valid(al_json_iter *it, const char *in, size_t n);
int al_json_iter_next(al_json_iter *it, al_slice *val);
/* The next element read as al_json_members reads an object, in the same pass that finds its
 * end: 1 when it is an object (vals filled), 2 when it is another value (vals all {NULL, 0}),
 * 0 at the end, -1 on bad input; *val is the whole element. */
int al_json_iter_next_members(al_json_iter *it, const char *const *keys, al_slice *vals,
                              size_t nkeys, al_slice *val);

#endif
