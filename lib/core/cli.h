/*
 * cli.h: the flags every arclight command shares and the exit-status convention.
 *
 *   --bootstrap HOST:PORT[,HOST:PORT]  default $ARCLIGHT_BOOTSTRAP, else 127.0.0.1:9092
 *   --config FILE                      client settings (librdkafka keys), over broker-config/client.conf
 *   --metrics HOST:PORT                serve /metrics and /healthz there
 *   --log-level error|warn|info|debug
 *
 * Exit status: 0 success, 2 bad usage (reason on stderr), 1 any other failure.
 *
 * A command lists AL_CLI_COMMON_OPTIONS in its getopt_long table and passes every option
 * it does not know itself to al_cli_common_option().
 */
#ifndef ARCLIGHT_CLI_H
#define ARCLIGHT_CLI_H

#include <getopt.h>

enum {
    AL_EXIT_OK = 0,
    AL_EXIT_FAILURE = 1,
    AL_EXIT_USAGE = 2,
};

/* getopt_long values for the shared flags; command-specific flags use values from
 * AL_CLI_OPT_USER upwards or plain characters. */
enum {
    AL_CLI_OPT_BOOTSTRAP = 1000,
    AL_CLI_OPT_CONFIG,
    AL_CLI_OPT_METRICS,
    AL_CLI_OPT_LOG_LEVEL,
    AL_CLI_OPT_USER = 1100,
};

#define AL_CLI_COMMON_OPTIONS                                                                      \
    {"bootstrap", required_argument, 0, AL_CLI_OPT_BOOTSTRAP},                                     \
        {"config", required_argument, 0, AL_CLI_OPT_CONFIG},                                       \
        {"metrics", required_argument, 0, AL_CLI_OPT_METRICS},                                     \
        {"log-level", required_argument, 0, AL_CLI_OPT_LOG_LEVEL}

#define AL_CLI_COMMON_HELP                                                                         \
    "  --bootstrap HOST:PORT[,..]  Kafka bootstrap servers (default $ARCLIGHT_BOOTSTRAP,\n"        \
    "                              else 127.0.0.1:9092)\n"                                         \
    "  --config FILE               client settings file (librdkafka keys)\n"                       \
    "  --metrics HOST:PORT         serve Prometheus /metrics and /healthz there\n"                  \
    "  --log-level LEVEL           error, warn, info (default) or debug\n"

typedef struct al_cli_common {
    const char *bootstrap; /* never NULL after al_cli_common_init */
    const char *config;    /* NULL: none */
    const char *metrics;   /* NULL: no metrics endpoint */
} al_cli_common;

/* Fills defaults (bootstrap from the environment) and sets the log level from the
 * environment. */
void al_cli_common_init(al_cli_common *c);

/* Handles one shared option. Returns 1 if it was one (and valid), 0 if `opt` is not a
 * shared option, -1 with a message on stderr if its value is invalid (exit with 2). */
int al_cli_common_option(al_cli_common *c, int opt, const char *arg);

/* Prints "arclight CMD: message" and a hint to stderr; returns AL_EXIT_USAGE. */
int al_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Splits "host:port" (IPv4, name, or [IPv6]) into host and port. 0 or -1. */
int al_cli_parse_hostport(const char *s, char *host, unsigned hostlen, int *port);

#endif
