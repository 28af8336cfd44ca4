/*
 * flags.h: a command's flags as data. A table of rows (name, short letter, kind, range,
 * destination, value name, help) gives the getopt_long table, the usage text and the range
 * checks, so that a command's main is its table and what it does with the values.
 *
 *   static int64_t max = -1;
 *   static const al_flag flags[] = {
 *       {"max", 'n', AL_FLAG_I64, &max, .lo = 1, .hi = INT64_MAX, .arg = "N",
 *        .help = "stop after N messages"},
 *       ...
 *   };
 *   static const al_cmd_spec spec = {"tail", "TOPIC... [flags]", "Prints ...", flags,
 *                                    AL_ARRAY_LEN(flags), .common = 1};
 *   int first;
 *   int rc = al_flags_parse(&spec, &common, argc, argv, &first);
 *   if (rc != AL_FLAGS_GO) return rc;   -- 0 after --help, 2 after a usage error
 *
 * A usage error names the flag and what it wants ("--max wants an integer from 1 to ..., got
 * 'x'") on stderr, as al_cli_usage_error does; --help and -h print the usage on stdout.
 */
#ifndef ARCLIGHT_CORE_FLAGS_H
#define ARCLIGHT_CORE_FLAGS_H

#include "core/cli.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum al_flag_kind {
    AL_FLAG_SWITCH, /* no value: *(int *)dest = 1 (or .lo when it is non-zero) */
    AL_FLAG_INT,    /* int in [lo, hi] */
    AL_FLAG_I64,    /* int64_t in [lo, hi] */
    AL_FLAG_DOUBLE, /* double in [dlo, dhi] */
    AL_FLAG_STRING, /* const char *, argv's own (not copied); .choices limits it when set */
    AL_FLAG_FUNC,   /* .parse(dest, value, err, errlen): 0, or -1 with what it wants in err */
} al_flag_kind;

typedef struct al_flag {
    const char *name; /* the long name, without its dashes */
    char letter;      /* the short name, 0 for none */
    al_flag_kind kind;
    void *dest;
    int64_t lo, hi;              /* AL_FLAG_INT, AL_FLAG_I64 (hi 0 with lo 0: no bound) */
    double dlo, dhi;             /* AL_FLAG_DOUBLE (both 0: no bound) */
    const char *arg;             /* the value's name in the usage text ("N", "HOST:PORT") */
    const char *help;            /* '\n' starts a continuation line */
    const char *const *choices;  /* AL_FLAG_STRING: NULL-terminated list of allowed values */
    int (*parse)(void *dest, const char *value, char *err, size_t errlen); /* AL_FLAG_FUNC */
} al_flag;

typedef struct al_cmd_spec {
    const char *name;     /* "tail": messages say "arclight tail: ..." */
    const char *synopsis; /* after "usage: arclight NAME " */
    const char *about;    /* paragraphs between the usage line and the flags; may be NULL */
    const al_flag *flags;
    size_t nflags;
    int common;           /* 1: the shared flags (cli.h) too */
    const char *epilog;   /* text after the flags; may be NULL */
} al_cmd_spec;

enum { AL_FLAGS_GO = -1 };

/* Parses argv[1..] by the spec: each flag's value checked and stored, the shared flags into
 * *common (when spec->common; al_cli_common_init it first). Flags and operands may mix; the
 * operands end up in argv[*first..argc) in their order. Returns AL_FLAGS_GO to carry on,
 * AL_EXIT_OK after printing the usage for --help/-h, or AL_EXIT_USAGE after a usage error on
 * stderr. */
int al_flags_parse(const al_cmd_spec *spec, al_cli_common *common, int argc, char **argv,
                   int *first);

/* The usage text: usage line, about, one aligned row per flag, the shared flags, epilog. */
void al_flags_usage(const al_cmd_spec *spec, FILE *f);

#endif
