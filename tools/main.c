/*
 * arclight: one binary, `arclight COMMAND [flags]`. Each command lives in its own file
 * and defines `int cmd_NAME(int argc, char **argv)` (argv[0] is the command name). The
 * table below names every command; one whose implementation is not linked into this
 * build is left out of the help and reported as unavailable.
 */
#include "core/cli.h"
#include "core/log.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

typedef int (*command_fn)(int argc, char **argv);

#define COMMAND_DECL(name) extern int cmd_##name(int argc, char **argv) __attribute__((weak))
COMMAND_DECL(broker);
COMMAND_DECL(topics);
COMMAND_DECL(tail);
COMMAND_DECL(record);
COMMAND_DECL(replay);
COMMAND_DECL(proxy);
COMMAND_DECL(credit);
COMMAND_DECL(batch);
COMMAND_DECL(train);
COMMAND_DECL(serve);
COMMAND_DECL(sync);
COMMAND_DECL(rollouts);
COMMAND_DECL(up);
COMMAND_DECL(model);

static const struct command {
    const char *name;
    command_fn fn;
    const char *summary;
} commands[] = {
    {"broker", cmd_broker, "run the embedded Kafka broker (librdkafka mock cluster)"},
    {"topics", cmd_topics, "create arclight's topics on a Kafka cluster"},
    {"tail", cmd_tail, "print a topic's messages as JSON lines"},
    {"record", cmd_record, "write topics to an Avro container file"},
    {"replay", cmd_replay, "publish a recording back into a cluster"},
    {"proxy", cmd_proxy, "capture proxy between an agent and its model server"},
    {"credit", cmd_credit, "turn rollouts into transitions with advantages"},
    {"batch", cmd_batch, "pack transitions into trainer steps"},
    {"train", cmd_train, "update the policy from batches"},
    {"serve", cmd_serve, "OpenAI-compatible policy server"},
    {"sync", cmd_sync, "bring SGLang / vLLM / arclight serve replicas to each new policy"},
    {"rollouts", cmd_rollouts, "run an agent over a task dataset (rollout controller)"},
    {"up", cmd_up, "run the whole loop on this machine"},
    {"model", cmd_model, "model utilities (init a random model, inspect)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: arclight COMMAND [flags]   (arclight COMMAND --help)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (commands[i].fn) fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nshared flags:\n" AL_CLI_COMMON_HELP);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    al_log_init_from_env();
    if (argc < 2) {
        usage(stderr);
        return AL_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return AL_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name) != 0) continue;
        if (!commands[i].fn) {
            fprintf(stderr, "arclight: command '%s' is not part of this build yet\n", argv[1]);
            return AL_EXIT_USAGE;
        }
        return commands[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "arclight: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return AL_EXIT_USAGE;
}
