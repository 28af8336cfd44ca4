/*
 * flags.c: command-line flags from a table (flags.h).
 */
#include "core/flags.h"

#include "core/parse.h"
#include "core/util.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#define FLAGS_MAX 96
/* getopt_long's value for row i of the table (short letters map back to rows by search). */
#define FLAG_VAL(i) (AL_CLI_OPT_USER + 100 + (int)(i))
#define FLAG_HELP_VAL (AL_CLI_OPT_USER + 99)

static int wants_value(const al_flag *f)
{
    return f->kind != AL_FLAG_SWITCH;
}

/* Stores one flag's value; 0, or -1 after a usage error naming the flag. */
static int flag_set(const al_cmd_spec *spec, const al_flag *f, const char *v)
{
    switch (f->kind) {
    case AL_FLAG_SWITCH:
        *(int *)f->dest = f->lo ? (int)f->lo : 1;
        return 0;
    case AL_FLAG_INT:
    case AL_FLAG_I64: {
        int64_t lo = f->lo, hi = f->hi, x;
        if (!lo && !hi) lo = INT64_MIN, hi = INT64_MAX;
        if (f->kind == AL_FLAG_INT) {
            if (lo < INT32_MIN) lo = INT32_MIN;
            if (hi > INT32_MAX) hi = INT32_MAX;
        }
        if (al_parse_i64(v, lo, hi, &x) != 0) {
            if (hi == INT64_MAX || hi == INT32_MAX)
                al_cli_usage_error(spec->name, "--%s wants an integer of at least %lld, got '%s'",
                                   f->name, (long long)lo, v);
            else
                al_cli_usage_error(spec->name, "--%s wants an integer from %lld to %lld, got '%s'",
                                   f->name, (long long)lo, (long long)hi, v);
            return -1;
        }
        if (f->kind == AL_FLAG_INT)
            *(int *)f->dest = (int)x;
        else
            *(int64_t *)f->dest = x;
        return 0;
    }
    case AL_FLAG_DOUBLE: {
        double lo = f->dlo, hi = f->dhi, x;
        if (lo == 0 && hi == 0) lo = -1e308, hi = 1e308;
        if (al_parse_double(v, lo, hi, &x) != 0) {
            al_cli_usage_error(spec->name, "--%s wants a number from %g to %g, got '%s'", f->name,
                               lo, hi, v);
            return -1;
        }
        *(double *)f->dest = x;
        return 0;
    }
    case AL_FLAG_STRING:
        if (f->choices) {
            size_t i = 0;
            while (f->choices[i] && strcmp(f->choices[i], v) != 0) i++;
            if (!f->choices[i]) {
                char want[512];
                size_t n = 0;
                want[0] = '\0';
                for (i = 0; f->choices[i] && n < sizeof want; i++)
                    n += (size_t)snprintf(want + n, sizeof want - n, "%s%s",
                                          i ? (f->choices[i + 1] ? ", " : " or ") : "",
                                          f->choices[i]);
                al_cli_usage_error(spec->name, "--%s wants %s, got '%s'", f->name, want, v);
                return -1;
            }
        }
        *(const char **)f->dest = v;
        return 0;
    case AL_FLAG_FUNC: {
        char err[256] = "";
        if (f->parse(f->dest, v, err, sizeof err) != 0) {
            al_cli_usage_error(spec->name, "--%s %s, got '%s'", f->name,
                               err[0] ? err : "has a bad value", v);
            return -1;
        }
        return 0;
    }
    }
    return -1;
}

int al_flags_parse(const al_cmd_spec *spec, al_cli_common *common, int argc, char **argv,
                   int *first)
{
    static const struct option shared[] = {AL_CLI_COMMON_OPTIONS};
    struct option opts[FLAGS_MAX + 8];
    char shorts[2 * FLAGS_MAX + 4];
    size_t no = 0, ns = 0;
    if (spec->nflags > FLAGS_MAX) {
        fprintf(stderr, "arclight %s: the flag table has more than %d rows\n", spec->name,
                FLAGS_MAX);
        return AL_EXIT_FAILURE;
    }
    shorts[ns++] = ':'; /* a missing value is ':', not '?' */
    shorts[ns++] = 'h';
    for (size_t i = 0; i < spec->nflags; i++) {
        const al_flag *f = &spec->flags[i];
        opts[no++] = (struct option){f->name, wants_value(f) ? required_argument : no_argument, 0,
                                     FLAG_VAL(i)};
        if (f->letter) {
            shorts[ns++] = f->letter;
            if (wants_value(f)) shorts[ns++] = ':';
        }
    }
    shorts[ns] = '\0';
    opts[no++] = (struct option){"help", no_argument, 0, FLAG_HELP_VAL};
    if (spec->common)
        for (size_t i = 0; i < AL_ARRAY_LEN(shared); i++) opts[no++] = shared[i];
    opts[no] = (struct option){0, 0, 0, 0};

    optind = 1;
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, shorts, opts, NULL)) != -1) {
        if (opt == 'h' || opt == FLAG_HELP_VAL) {
            al_flags_usage(spec, stdout);
            return AL_EXIT_OK;
        }
        if (opt == ':') return al_cli_usage_error(spec->name, "%s needs a value", argv[optind - 1]);
        if (opt == '?')
            return al_cli_usage_error(spec->name, "unknown option '%s'", argv[optind - 1]);
        const al_flag *f = NULL;
        if (opt >= FLAG_VAL(0) && opt < FLAG_VAL(spec->nflags)) {
            f = &spec->flags[opt - FLAG_VAL(0)];
        } else {
            for (size_t i = 0; i < spec->nflags && !f; i++)
                if (spec->flags[i].letter && spec->flags[i].letter == opt) f = &spec->flags[i];
        }
        if (f) {
            if (flag_set(spec, f, optarg) != 0) return AL_EXIT_USAGE;
            continue;
        }
        int r = spec->common ? al_cli_common_option(common, opt, optarg) : 0;
        if (r < 0) return AL_EXIT_USAGE;
        if (r == 0) return al_cli_usage_error(spec->name, "unknown option '%s'", argv[optind - 1]);
    }
    *first = optind;
    return AL_FLAGS_GO;
}

/* Writes text with each line after the first indented to col. */
static void put_indented(FILE *f, const char *text, int col)
{
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        fwrite(p, 1, n, f);
        fputc('\n', f);
        if (!nl || !nl[1]) break;
        p = nl + 1;
        fprintf(f, "%*s", col, "");
    }
}

void al_flags_usage(const al_cmd_spec *spec, FILE *f)
{
    fprintf(f, "usage: arclight %s %s\n", spec->name, spec->synopsis ? spec->synopsis : "");
    if (spec->about) fprintf(f, "\n%s", spec->about);
    fputc('\n', f);
    char left[128];
    int col = spec->common ? 30 : 0; /* the shared flags' column (AL_CLI_COMMON_HELP) */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < spec->nflags; i++) {
            const al_flag *fl = &spec->flags[i];
            const char *v = fl->arg ? fl->arg : "";
            int n = fl->letter ? snprintf(left, sizeof left, "  -%c, --%s%s%s", fl->letter,
                                          fl->name, *v ? " " : "", v)
                               : snprintf(left, sizeof left, "  --%s%s%s", fl->name,
                                          *v ? " " : "", v);
            if (pass == 0) {
                if (n + 2 > col && n < 40) col = n + 2;
                continue;
            }
            fputs(left, f);
            if (n + 1 > col) {
                fprintf(f, "\n%*s", col, "");
            } else {
                fprintf(f, "%*s", col - n, "");
            }
            put_indented(f, fl->help ? fl->help : "", col);
        }
    if (spec->common) fputs(AL_CLI_COMMON_HELP, f);
    if (spec->epilog) fprintf(f, "\n%s", spec->epilog);
}
