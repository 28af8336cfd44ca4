/*
 * t0749_tokenizer_util.h: helpers shared by the tokenizer tests (0700-0748): fixture
 * paths, file reading, and a compact JSON writer for al_json trees.
 */
#ifndef ARCLIGHT_T0749_TOKENIZER_UTIL_H
#define ARCLIGHT_T0749_TOKENIZER_UTIL_H

#include "text/json.h"
#include "text/tokenizer.h"
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* $ARCLIGHT_SOURCE_DIR/rel (the repo root is the working directory otherwise). */
static inline char *tok_source_path(const char *rel)
{
    const char *root = getenv("ARCLIGHT_SOURCE_DIR");
    if (!root) root = ".";
    size_t n = strlen(root) + strlen(rel) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", root, rel);
    return p;
}

/* Where tests/model_tokenizer.cmake unpacked tests/tokenizer/qwen3.tar.xz. */
static inline char *tok_qwen3_dir(void)
{
    const char *build = getenv("ARCLIGHT_BUILD_DIR");
    if (!build) build = "build";
    size_t n = strlen(build) + 32;
    char *p = malloc(n);
    snprintf(p, n, "%s/tokenizer/qwen3", build);
    return p;
}

/* Parses a fixture under the source tree; NULL (with a message) when it is missing. */
static inline al_json *tok_load_fixture(const char *rel)
{
    char *path = tok_source_path(rel);
    size_t len = 0;
    char *text = al_test_slurp(path, &len);
    if (!text) {
        fprintf(stderr, "cannot read %s\n", path);
        free(path);
        return NULL;
    }
    char err[200];
    al_json *j = al_json_parse(text, len, err, sizeof err);
    if (!j) fprintf(stderr, "%s: %s\n", path, err);
    free(text);
    free(path);
    return j;
}


/* Index of the first difference of two byte strings (or the shorter length). */
static inline size_t tok_first_diff(const char *a, size_t alen, const char *b, size_t blen)
{
    size_t i = 0;
    while (i < alen && i < blen && a[i] == b[i])
        i++;
    return i;
}

#endif
