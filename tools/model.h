/*
 * model.h: what `arclight model`'s subcommands (model.c, model_sft.c) share.
 */
#ifndef ARCLIGHT_TOOLS_MODEL_H
#define ARCLIGHT_TOOLS_MODEL_H

#include <stddef.h>
#include <stdint.h>

/* `arclight model sft` (model_sft.c); argv[0] is "sft". */
int model_sft(int argc, char **argv);

/* A --seed flag's value and whether it was given. */
typedef struct model_seed {
    uint64_t value;
    int given;
} model_seed;

/* An AL_FLAG_FUNC parser for --seed: an unsigned 64-bit integer into *(model_seed *)dest. */
int model_parse_seed(void *dest, const char *v, char *err, size_t errlen);

#endif
