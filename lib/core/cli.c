#include "core/cli.h"

#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void al_cli_common_init(al_cli_common *c)
{
    const char *env = getenv("ARCLIGHT_BOOTSTRAP");
    memset(c, 0, sizeof *c);
    c->bootstrap = (env && *env) ? env : "127.0.0.1:9092";
    al_log_init_from_env();
}

int al_cli_common_option(al_cli_common *c, int opt, const char *arg)
{
    switch (opt) {
    case AL_CLI_OPT_BOOTSTRAP:
        if (!arg || !*arg) {
            fprintf(stderr, "arclight: --bootstrap needs HOST:PORT[,HOST:PORT]\n");
            return -1;
        }
        c->bootstrap = arg;
        return 1;
    case AL_CLI_OPT_CONFIG:
        c->config = arg;
        return 1;
    case AL_CLI_OPT_METRICS: {
        char host[256];
        int port;
        if (al_cli_parse_hostport(arg, host, sizeof host, &port) != 0) {
            fprintf(stderr, "arclight: --metrics wants HOST:PORT, got '%s'\n", arg);
            return -1;
        }
        c->metrics = arg;
        return 1;
    }
    case AL_CLI_OPT_LOG_LEVEL: {
        int l = al_log_level_parse(arg);
        if (l < 0) {
            fprintf(stderr, "arclight: --log-level wants error, warn, info or debug, got '%s'\n",
                    arg);
            return -1;
        }
        al_log_set_level(l);
        return 1;
    }
    default:
        return 0;
    }
}

int al_cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "arclight %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see 'arclight %s --help')\n", cmd);
    return AL_EXIT_USAGE;
}

int al_cli_parse_hostport(const char *s, char *host, unsigned hostlen, int *port)
{
    const char *colon;
    size_t hl;
    char *end;
    long p;

    if (!s || !*s) return -1;
    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (!rb || rb[1] != ':') return -1;
        hl = (size_t)(rb - s - 1);
        s++;
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon) return -1;
        hl = (size_t)(colon - s);
    }
    if (hl == 0 || hl >= hostlen) return -1;
    p = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || p < 0 || p > 65535) return -1;
    memcpy(host, s, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}
