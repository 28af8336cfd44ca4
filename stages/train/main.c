/*
 * main.c: `arclight train`, the trainer stage's worker. Consumes arclight.batches for
 * one model (a consumer-group member), assembles each step from its chunks (assembler.h),
 * runs the update (lib/model/trainer.h), writes the new weights under --out, and publishes a
 * PolicyVersion to arclight.policy keyed by the model name.
 *
 * Versions. The weights of --model are version 0; update k makes version k and writes
 * OUT/step-k/: a full checkpoint (lib/model/checkpoint.h: weights, AdamW moments, trainer
 * state) every --checkpoint-every updates, the weights and config alone in between, so that
 * every PolicyVersion names weights a server can load. The checkpoint's trainer_state.json
 * records, among its metrics, the batch step last applied ("batch_step").
 *
 * Delivery. A step's chunk offsets are stored only once its PolicyVersion is acknowledged
 * and a full checkpoint at or after its version is on disk. After kill -9, `--resume` loads
 * the newest full checkpoint, publishes its PolicyVersion again (the topic is compacted: the
 * same version twice is harmless), skips chunks of steps up to its batch_step and re-applies
 * the rest, which gives bitwise the same weights (the trainer has no randomness). So a step
 * is neither lost nor applied twice to the weights. On SIGTERM the worker writes a full
 * checkpoint of its last update first, so that a clean stop re-applies nothing.
 *
 * Bad chunks (undecodable, inconsistent shapes or totals, tokens outside the vocabulary)
 * and steps the trainer refuses go to arclight.deadletter with the reason.
 *
 * Data parallelism (lib/model/dist.h; ARCLIGHT_DIST_WORLD > 1, one process per GPU). Rank 0
 * is the trainer described above. Every other rank is a follower: it reads the whole topic
 * with a consumer group of its own (new at each start, from the beginning, nothing
 * committed), skips the steps rank 0's checkpoint holds, and runs every step with rank 0
 * (its share of the chunks, gradients summed over NCCL); it writes no checkpoint and
 * publishes nothing. At start every rank takes rank 0's weights, moments and step counts, so
 * a restart of any rank is a restart of the group from rank 0's newest full checkpoint.
 *
 * Files: this page (the worker's hooks, the flags), steps.c (a complete step applied),
 * versions.c (writing and publishing a version), resume.c (--resume), assembler.c (steps
 * from their chunks), ckpt_http.c (GET /checkpoints/ on --listen); train.h is what they
 * share.
 */
#include "assembler.h"
#include "ckpt_http.h"
#include "train.h"

#include "avro/codec.h"
#include "core/cli.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/util.h"
#include "http/metrics.h"
#include "kafka/kafka.h"
#include "kafka/stage.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/dist.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "core/sha256.h"
#include "model/trainer.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Trainer settings as flags: --NAME with '_' written '-', handed to al_trainer_config_set. */
static const char *const setting_keys[] = {
    "loss", "loss_agg", "eps_low", "eps_high", "dual_clip", "tis_cap", "kl", "kl_beta",
    "entropy_coef", "ppo_epochs", "mini_batches", "temperature", "decay_1d", "lr", "beta1",
    "beta2", "adam_eps", "weight_decay", "grad_clip", "lr_schedule", "warmup_steps",
    "total_steps", "min_lr_ratio"};
#define N_SETTINGS (sizeof setting_keys / sizeof setting_keys[0])

static void metrics_init(train_metrics *m)
{
    al_metrics *r = m->reg;
    const char *cn = "arclight_train_chunks_total", *ch = "BatchChunk messages consumed, by outcome";
    m->held = al_metrics_counter(r, cn, ch, "result", "held", NULL);
    m->other = al_metrics_counter(r, cn, ch, "result", "other_model", NULL);
    m->skipped = al_metrics_counter(r, cn, ch, "result", "applied_before", NULL);
    m->dup = al_metrics_counter(r, cn, ch, "result", "duplicate", NULL);
    m->bad = al_metrics_counter(r, cn, ch, "result", "dead_lettered", NULL);
    m->steps = al_metrics_counter(r, "arclight_train_steps_total", "Updates applied", NULL);
    m->bad_steps = al_metrics_counter(r, "arclight_train_bad_steps_total",
                                      "Steps dead-lettered (incomplete, inconsistent, refused)", NULL);
    m->tokens = al_metrics_counter(r, "arclight_train_tokens_total", "Tokens trained through", NULL);
    m->version = al_metrics_gauge(r, "arclight_train_policy_version", "Latest policy version", NULL);
    m->loss = al_metrics_gauge(r, "arclight_train_loss", "Loss of the last update", NULL);
    m->kl = al_metrics_gauge(r, "arclight_train_kl", "KL to the reference, last update", NULL);
    m->entropy = al_metrics_gauge(r, "arclight_train_entropy", "Entropy, last update", NULL);
    m->clip = al_metrics_gauge(r, "arclight_train_clip_fraction", "Clipped fraction, last update", NULL);
    m->gnorm = al_metrics_gauge(r, "arclight_train_grad_norm", "Gradient norm, last update", NULL);
    m->tps = al_metrics_gauge(r, "arclight_train_tokens_per_second", "Throughput, last update", NULL);
    m->lr = al_metrics_gauge(r, "arclight_train_learning_rate", "Learning rate, last update", NULL);
    m->pending = al_metrics_gauge(r, "arclight_train_steps_held", "Steps waiting for chunks", NULL);
}

static int mkdir_p(const char *path, char *errstr, size_t errlen)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return al_err(errstr, errlen, "cannot create %s: %s", p, strerror(errno)), -1;
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return al_err(errstr, errlen, "cannot create %s: %s", p, strerror(errno)), -1;
    return 0;
}

/* ---- the worker's hooks (kafka/stage.h) ------------------------------------------------------- */

static void on_delivery(al_stage *s, const al_delivery *d, void *ctx)
{
    (void)s;
    train_worker *w = ctx;
    applied *a = d->opaque;
    if (!a) return; /* a dead letter, or the resume version: the tracker / flush sees it */
    if (d->err) {
        al_stage_fail(&w->st,
                      "PolicyVersion %" PRId64 " not delivered: %s; stopping without storing its "
                      "chunks' offsets (a restart with --resume publishes it again)",
                      a->version, d->reason);
        return;
    }
    a->acked = 1;
    if (AL_FAULT_POINTS && w->o->kill_version == a->version && w->o->kill_after_ack)
        al_fault_kill(COMP, "after PolicyVersion %" PRId64 " was acknowledged", a->version);
}

/* Steps of a model come from one trainer: a second member taking partitions away stops this
 * one (the other continues from the stored offsets). */
static void on_rebalance(al_stage *s, al_rebalance_event ev,
                         const rd_kafka_topic_partition_list_t *parts, void *ctx)
{
    train_worker *w = ctx;
    int n;
    if (!al_stage_partitions_taken(s, ev, parts, &n)) return;
    al_stage_fail(
        &w->st,
        "the consumer group took %d partition%s of %s away from this trainer (another "
        "trainer of the model joined group %s?); one trainer per model, so this one stops",
        n, n == 1 ? "" : "s", w->o->input_topic, w->o->group);
}

/* Before consuming: the checkpoint server, the data-parallel group, the newest checkpoint
 * (--resume; its version published again), every rank on rank 0's weights and counts, and
 * the step assembler from the batch step reached. */
static int on_prepare(al_stage *s, void *ctx, char *errstr, size_t errlen)
{
    train_worker *w = ctx;
    train_opts *o = w->o;
    char err[1024];
    if (o->listen && !(w->http = al_ckpt_http_start(o->listen, w->out_abs, err, sizeof err)))
        return al_err(errstr, errlen, "%s", err);
    if (w->dopt.world > 1) {
        w->follower = w->dopt.rank != 0;
        al_log_info(COMP, "data parallel: rank %d of %d, rendezvous at %s", w->dopt.rank,
                    w->dopt.world, w->dopt.addr);
        if (!(w->dist = al_dist_new(w->be, &w->dopt, err, sizeof err)))
            return al_err(errstr, errlen, "%s", err);
    }
    if (o->resume && !w->follower) {
        int r = train_resume(w, errstr, errlen);
        if (r < 0) return -1;
        if (r == 1)
            al_log_info(COMP, "--resume: no checkpoint under %s; starting from %s", w->out_abs,
                        o->model_dir);
    }
    if (w->dist) {
        /* everyone takes rank 0's weights, moments and counts (the largest after a resume) */
        if (al_trainer_set_dist(w->tr, w->dist, err, sizeof err) != 0)
            return al_err(errstr, errlen, "%s", err);
        double counts[2] = {(double)w->version, (double)w->batch_step};
        al_dist_allreduce_host(w->dist, counts, 2, 1);
        w->version = (int64_t)counts[0], w->batch_step = (int64_t)counts[1];
        w->last_full = w->version;
    }
    if (w->follower) {
        snprintf(w->follower_group, sizeof w->follower_group, "%s-rank%d-%lld-%d", o->group,
                 al_dist_rank(w->dist), (long long)time(NULL), (int)getpid());
        o->group = w->follower_group;
        al_stage_set_group(s, o->group);
    }
    const al_model_config *mc = al_model_config_of(w->policy);
    if (!(w->asmb = al_train_asm_new(o->model_name, mc->vocab_size, mc->max_position_embeddings,
                                     w->batch_step, err, sizeof err)))
        return al_err(errstr, errlen, "%s", err);
    return 0;
}

static void on_started(al_stage *s, void *ctx)
{
    train_worker *w = ctx;
    char uri[PATH_MAX + 128];
    train_version_uri(w, w->version, uri, sizeof uri);
    al_log_info(COMP, "training %s (%zu parameters) from %s as group %s; versions under %s "
                      "(next: version %" PRId64 ")",
                w->o->model_name, al_model_num_params(w->policy), w->o->input_topic,
                al_stage_group(s), uri, w->version + 1);
}

static void on_message(al_stage *s, rd_kafka_message_t *m, int64_t now, void *ctx)
{
    (void)now;
    train_worker *w = ctx;
    held_msg *h = calloc(1, sizeof *h);
    al_input *in = al_consumer_input_begin(al_stage_consumer(s), m);
    if (!h || !in) {
        free(h);
        rd_kafka_message_destroy(m);
        al_stage_fail(&w->st, "out of memory");
        return;
    }
    h->m = m;
    h->in = in;
    char why[700];
    al_train_asm_result res = al_train_asm_add(w->asmb, m->payload, m->len, h, why, sizeof why);
    switch (res) {
    case AL_TRAIN_ASM_HELD:
        al_counter_inc(w->met.held);
        al_log_debug(COMP, "%s", why);
        break;
    case AL_TRAIN_ASM_BAD:
        al_log_warn(COMP, "%s [%d] offset %" PRId64 ": %s; dead-lettered", w->o->input_topic,
                    (int)m->partition, m->offset, why);
        train_step_deadletter(w, (void **)&h, 1, why);
        train_held_release(NULL, h);
        break;
    default:
        al_counter_inc(res == AL_TRAIN_ASM_OTHER_MODEL ? w->met.other
                       : res == AL_TRAIN_ASM_APPLIED   ? w->met.skipped
                                                       : w->met.dup);
        al_log_debug(COMP, "%s [%d] offset %" PRId64 ": %s; skipped", w->o->input_topic,
                     (int)m->partition, m->offset, why);
        train_held_release(NULL, h);
    }
}

static int on_tick(al_stage *s, int got, int64_t now, void *ctx)
{
    (void)got, (void)now;
    train_worker *w = ctx;
    al_train_ready *ready;
    while (!al_stage_failed(&w->st) && !al_stage_stop_requested() &&
           al_train_asm_next(w->asmb, &ready) == 1)
        train_step_apply(w, ready);
    al_producer_poll(al_stage_producer(s), 0);
    train_applied_retire(w);
    al_gauge_set(w->met.pending, (double)al_train_asm_pending(w->asmb));
    if (w->o->stop_after > 0 && w->version >= w->o->stop_after) {
        /* the drain checkpoints it and waits for its acknowledgement */
        al_log_info(COMP, "version %" PRId64 " reached: stopping (--steps)", w->version);
        return 1;
    }
    return 0;
}

/* A clean stop: checkpoint the last update so that its chunks need not be re-applied. */
static void on_stopping(al_stage *s, void *ctx)
{
    (void)s;
    train_worker *w = ctx;
    char err[1024], sha[65];
    if (!w->follower && w->version > w->last_full &&
        train_version_save(w, 1, w->last_metrics, sha, err, sizeof err) != 0)
        al_stage_fail(&w->st, "checkpoint at exit: %s", err);
}

static void on_drained(al_stage *s, int flushed, void *ctx)
{
    (void)s, (void)flushed;
    train_worker *w = ctx;
    if (!al_stage_failed(&w->st)) train_applied_retire(w);
}

/* Steps not acknowledged and checkpointed keep their inputs unfinished: the consumer committed
 * only what was stored, and a restart re-reads them. Their handles are released now that the
 * consumer is gone, when releasing them can no longer store anything. */
static void on_release(al_stage *s, void *ctx)
{
    (void)s;
    train_worker *w = ctx;
    while (w->applied_head) {
        applied *a = w->applied_head;
        w->applied_head = a->next;
        train_applied_free(a);
    }
    al_train_asm_free(w->asmb, train_held_release, NULL);
    w->asmb = NULL;
}

static const al_stage_hooks train_hooks = {
    .prepare = on_prepare,
    .started = on_started,
    .message = on_message,
    .tick = on_tick,
    .rebalance = on_rebalance,
    .delivery = on_delivery,
    .stopping = on_stopping,
    .drained = on_drained,
    .release = on_release,
};

/* ---- flags ------------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: arclight train --model DIR --out CKPT_DIR [flags]\n"
            "Trains a policy on the steps of arclight.batches (BatchChunk) for its model and\n"
            "publishes a PolicyVersion to arclight.policy after each update.\n\n"
            "  --model DIR               initial weights (config.json + model.safetensors); also the\n"
            "                            frozen reference model when --kl-beta > 0\n"
            "  --out DIR                 versions go to DIR/step-N/ (N = version)\n"
            "  --resume                  continue from the newest full checkpoint in --out (without\n"
            "                            it, --out must hold no checkpoint)\n"
            "  --model-name NAME         model name of the chunks and versions (default: basename\n"
            "                            of --model)\n"
            "  --checkpoint-every N      full checkpoint (weights + optimizer + state) every N updates;\n"
            "                            weights only in between (default 1)\n"
            "  --keep N                  keep the newest N versions on disk (default 5; 0: all)\n"
            "  --listen HOST:PORT        serve GET /checkpoints/... there (port 0: any free one) and\n"
            "                            publish http:// URIs; without it, file:// URIs\n"
            "  --train-config FILE       trainer settings as a JSON object (flags below override;\n"
            "                            unknown members are ignored)\n"
            "  --input-topic T           default arclight.batches\n"
            "  --policy-topic T          default arclight.policy\n"
            "  --group ID                consumer group (default arclight-train-NAME)\n"
            "  --steps N                 stop at version N (checkpointed and acknowledged: exit 0)\n"
            "  --device cuda|cpu|auto    where the model trains (default auto: cuda when this build\n"
            "                            has the CUDA backend and a device is visible, else cpu)\n"
            "  --drain-timeout S         on SIGTERM, after the exit checkpoint, at most S seconds\n"
            "                            (default 15) to publish, commit and leave the group,\n"
            "                            whether or not Kafka answers\n"
            "Loss:\n"
            "  --loss ppo|gspo|cispo|sft (default ppo)\n"
            "  --loss-agg token-mean|seq-mean-token-sum|seq-mean-token-mean (default token-mean)\n"
            "  --eps-low E, --eps-high E clip range (default 0.2, 0.2; eps-high > eps-low: clip-higher)\n"
            "  --dual-clip C             dual clip for negative advantages, C > 1 (default 0: off)\n"
            "  --tis-cap C               truncated importance sampling vs the sampler (0: off)\n"
            "  --kl k1|k2|k3, --kl-beta B  KL to the reference model (default k3, 0)\n"
            "  --entropy-coef C          entropy bonus (default 0)\n"
            "  --temperature T           the sampler's temperature (default 1)\n"
            "Optimizer (AdamW):\n"
            "  --lr LR (default 1e-6), --beta1, --beta2, --adam-eps\n"
            "  --weight-decay W (default 0.01), --decay-1d 0|1 (decay norms and biases too)\n"
            "  --grad-clip G             max global gradient norm (default 1; 0: off)\n"
            "  --lr-schedule constant|cosine, --warmup-steps N, --total-steps N, --min-lr-ratio R\n"
            "  --ppo-epochs N (alias --epochs), --mini-batches N  passes and updates per step\n"
            "  --help\n" AL_CLI_COMMON_HELP);
}

enum {
    O_MODEL = AL_CLI_OPT_USER, O_OUT, O_RESUME, O_NAME, O_EVERY, O_KEEP, O_LISTEN, O_TCONF,
    O_IN, O_POLICY, O_GROUP, O_STEPS, O_EPOCHS, O_HELP, O_DEVICE, O_DRAIN,
    O_SETTING = AL_CLI_OPT_USER + 100
};

/* The getopt table: the fixed flags, then one per trainer setting (O_SETTING + its index). */
static const struct option *train_options(void)
{
    static char flag_names[N_SETTINGS][32];
    static struct option opts[N_SETTINGS + 32];
    static const struct option fixed[] = {
        {"model", required_argument, 0, O_MODEL},
        {"out", required_argument, 0, O_OUT},
        {"resume", no_argument, 0, O_RESUME},
        {"model-name", required_argument, 0, O_NAME},
        {"checkpoint-every", required_argument, 0, O_EVERY},
        {"keep", required_argument, 0, O_KEEP},
        {"listen", required_argument, 0, O_LISTEN},
        {"train-config", required_argument, 0, O_TCONF},
        {"input-topic", required_argument, 0, O_IN},
        {"policy-topic", required_argument, 0, O_POLICY},
        {"group", required_argument, 0, O_GROUP},
        {"steps", required_argument, 0, O_STEPS},
        {"epochs", required_argument, 0, O_EPOCHS},
        {"device", required_argument, 0, O_DEVICE},
        {"drain-timeout", required_argument, 0, O_DRAIN},
        {"help", no_argument, 0, O_HELP},
        AL_CLI_COMMON_OPTIONS,
    };
    size_t no = 0;
    for (size_t i = 0; i < AL_ARRAY_LEN(fixed); i++) opts[no++] = fixed[i];
    for (size_t i = 0; i < N_SETTINGS; i++) {
        snprintf(flag_names[i], sizeof flag_names[i], "%s", setting_keys[i]);
        for (char *s = flag_names[i]; *s; s++)
            if (*s == '_') *s = '-';
        opts[no++] = (struct option){flag_names[i], required_argument, 0, O_SETTING + (int)i};
    }
    opts[no] = (struct option){0, 0, 0, 0};
    return opts;
}

/* The command line as parsed: the options, the common flags, the trainer settings given as
 * flags (applied after --train-config, in their order) and the drain timeout. */
typedef struct train_cli {
    train_opts o;
    al_cli_common common;
    const char *set_keys[256], *set_vals[256];
    int nset;
    int64_t drain_s;
    char namebuf[PATH_MAX];       /* the default --model-name */
    char groupbuf[PATH_MAX + 32]; /* the default --group */
} train_cli;

/* Parses argv into cli (which it initializes) and checks the names. -1: go on; otherwise
 * the exit code (--help, or a usage error already printed). */
static int train_cli_parse(train_cli *cli, int argc, char **argv)
{
    const struct option *opts = train_options();
    train_opts *o = &cli->o;
    memset(cli, 0, sizeof *cli);
    al_cli_common_init(&cli->common);
    *o = (train_opts){
        .input_topic = AL_TOPIC_BATCHES,
        .policy_topic = AL_TOPIC_POLICY,
        .checkpoint_every = 1,
        .keep = 5,
        .stop_after = -1,
        .kill_version = -1,
    };
    cli->drain_s = AL_STAGE_DRAIN_DEFAULT_S;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        const char *name = NULL;
        int bad = 0;
        if (c >= O_SETTING && c < O_SETTING + (int)N_SETTINGS) {
            if (cli->nset >= 256) return al_cli_usage_error("train", "too many settings");
            cli->set_keys[cli->nset] = setting_keys[c - O_SETTING];
            cli->set_vals[cli->nset++] = optarg;
            continue;
        }
        switch (c) {
        case O_MODEL: o->model_dir = optarg; break;
        case O_DEVICE:
            if (strcmp(optarg, "cuda") && strcmp(optarg, "cpu") && strcmp(optarg, "auto"))
                return al_cli_usage_error("train", "--device must be cuda, cpu or auto, not '%s'", optarg);
            o->device = optarg;
            break;
        case O_OUT: o->out_dir = optarg; break;
        case O_RESUME: o->resume = 1; break;
        case O_NAME: o->model_name = optarg; break;
        case O_EVERY: name = "--checkpoint-every"; bad = al_stage_parse_i64(optarg, 1, &o->checkpoint_every); break;
        case O_KEEP: name = "--keep"; bad = al_stage_parse_i64(optarg, 0, &o->keep); break;
        case O_LISTEN: o->listen = optarg; break;
        case O_TCONF: o->train_config = optarg; break;
        case O_IN: o->input_topic = optarg; break;
        case O_POLICY: o->policy_topic = optarg; break;
        case O_GROUP: o->group = optarg; break;
        case O_STEPS: name = "--steps"; bad = al_stage_parse_i64(optarg, 1, &o->stop_after); break;
        case O_DRAIN: name = "--drain-timeout"; bad = al_stage_parse_i64(optarg, 0, &cli->drain_s); break;
        case O_EPOCHS:
            if (cli->nset >= 256) return al_cli_usage_error("train", "too many settings");
            cli->set_keys[cli->nset] = "ppo_epochs";
            cli->set_vals[cli->nset++] = optarg;
            break;
        case O_HELP:
        case 'h': usage(stdout); return AL_EXIT_OK;
        default: {
            int r = al_cli_common_option(&cli->common, c, optarg);
            if (r < 0) return AL_EXIT_USAGE;
            if (r == 0) return al_cli_usage_error("train", "unknown flag (see --help)");
        }
        }
        if (bad) return al_cli_usage_error("train", "%s wants a number, not '%s'", name, optarg);
    }
    if (optind < argc) return al_cli_usage_error("train", "unexpected argument '%s'", argv[optind]);
    if (!o->model_dir) return al_cli_usage_error("train", "--model DIR is required");
    if (!o->out_dir) return al_cli_usage_error("train", "--out CKPT_DIR is required");
    if (!o->model_name) {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s", o->model_dir);
        size_t n = strlen(tmp);
        while (n > 1 && tmp[n - 1] == '/') tmp[--n] = '\0';
        const char *b = strrchr(tmp, '/');
        snprintf(cli->namebuf, sizeof cli->namebuf, "%s", b ? b + 1 : tmp);
        o->model_name = cli->namebuf;
    }
    if (!*o->model_name) return al_cli_usage_error("train", "the model name is empty (give --model-name)");
    for (const char *s = o->model_name; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == '"' || *s == '\\')
            return al_cli_usage_error("train", "model name '%s': quotes, backslashes and control "
                                               "characters are not allowed", o->model_name);
    if (!o->group) {
        snprintf(cli->groupbuf, sizeof cli->groupbuf, "arclight-train-%s", o->model_name);
        o->group = cli->groupbuf;
    }
    if (o->listen) {
        char host[256];
        int port;
        if (al_cli_parse_hostport(o->listen, host, sizeof host, &port) != 0)
            return al_cli_usage_error("train", "--listen '%s' is not HOST:PORT", o->listen);
    }
    return -1;
}

/* The trainer's settings: the defaults, then --train-config, then the setting flags; and
 * the fault point, if any. -1: go on; otherwise the exit code of a usage error. */
static int train_cli_settings(train_cli *cli, al_trainer_config *tc)
{
    char err[1024];
    al_trainer_config_default(tc);
    if (cli->o.train_config) {
        size_t len = 0;
        char *text = al_file_read(cli->o.train_config, &len, err, sizeof err);
        if (!text) return al_cli_usage_error("train", "--train-config: %s", err);
        int r = al_trainer_config_from_json(tc, text, len, 1, err, sizeof err);
        free(text);
        if (r != 0) return al_cli_usage_error("train", "--train-config %s: %s", cli->o.train_config, err);
    }
    for (int i = 0; i < cli->nset; i++)
        if (al_trainer_config_set(tc, cli->set_keys[i], cli->set_vals[i], err, sizeof err) != 0)
            return al_cli_usage_error("train", "%s", err);
    /* A fault point (core/fault.h): "VERSION:checkpoint" SIGKILLs the trainer once that
     * version is on disk, before its PolicyVersion is sent; "VERSION:ack" once its
     * PolicyVersion is acknowledged, before its chunks' offsets are stored. */
    const char *kill_at = al_fault_spec("ARCLIGHT_TRAIN_TEST_KILL_AT");
    if (kill_at) {
        char when[32] = "";
        if (sscanf(kill_at, "%" SCNd64 ":%31s", &cli->o.kill_version, when) == 2)
            cli->o.kill_after_ack = strcmp(when, "ack") == 0;
        else
            cli->o.kill_version = -1;
    }
    return -1;
}

/* Everything the worker needs before the stage runs: metrics, the model (and the frozen
 * reference when --kl-beta > 0) on the backend, the trainer (a bad setting is a usage
 * error), --out (made, resolved, and holding no checkpoint unless --resume) and the
 * data-parallel options. -1: go on; otherwise the exit code, the error logged or printed
 * (train_worker_close frees what was made). */
static int train_worker_open(train_worker *w, const al_trainer_config *tc)
{
    train_opts *o = w->o;
    char err[1024];
    w->met.reg = al_metrics_new();
    if (!w->met.reg) return AL_EXIT_FAILURE;
    metrics_init(&w->met);
    al_metrics_add_process_metrics(w->met.reg);
    if (!(w->policy = al_model_load_dir(o->model_dir, err, sizeof err))) {
        al_log_error(COMP, "--model %s: %s", o->model_dir, err);
        return AL_EXIT_FAILURE;
    }
    if (tc->loss.kl_beta > 0 && !(w->reference = al_model_load_dir(o->model_dir, err, sizeof err))) {
        al_log_error(COMP, "reference model %s: %s", o->model_dir, err);
        return AL_EXIT_FAILURE;
    }
    if (!(w->be = al_backend_open(o->device ? o->device : "auto", err, sizeof err))) {
        al_log_error(COMP, "--device %s: %s", o->device ? o->device : "auto", err);
        return AL_EXIT_FAILURE;
    }
    if (al_model_set_backend(w->policy, w->be, err, sizeof err) != 0 ||
        (w->reference && al_model_set_backend(w->reference, w->be, err, sizeof err) != 0)) {
        al_log_error(COMP, "--device %s: %s", w->be->ops->name, err);
        return AL_EXIT_FAILURE;
    }
    al_log_info(COMP, "training on %s", w->be->ops->name);
    if (!(w->tr = al_trainer_new(w->policy, w->reference, tc, err, sizeof err)))
        return al_cli_usage_error("train", "%s", err);
    if (mkdir_p(o->out_dir, err, sizeof err) != 0 || !realpath(o->out_dir, w->out_abs)) {
        if (!*err) al_err(err, sizeof err, "cannot resolve %s: %s", o->out_dir, strerror(errno));
        al_log_error(COMP, "--out: %s", err);
        return AL_EXIT_FAILURE;
    }
    char lp[PATH_MAX + 64];
    int64_t ls;
    int r = al_checkpoint_latest(w->out_abs, lp, sizeof lp, &ls, err, sizeof err);
    if (r < 0) {
        al_log_error(COMP, "--out: %s", err);
        return AL_EXIT_FAILURE;
    }
    if (r == 1 && !o->resume)
        return al_cli_usage_error("train", "--out %s holds checkpoints (newest %s): pass --resume "
                                           "to continue from it, or choose another directory",
                                  o->out_dir, lp);
    if (al_dist_opts_from_env(&w->dopt, err, sizeof err) != 0)
        return al_cli_usage_error("train", "%s", err);
    return -1;
}

/* Frees what train_worker_open and the run made (any of it may be missing). */
static void train_worker_close(train_worker *w)
{
    al_train_asm_free(w->asmb, train_held_release, NULL);
    al_ckpt_http_stop(w->http);
    al_trainer_free(w->tr);
    al_model_free(w->reference);
    al_model_free(w->policy);
    al_dist_free(w->dist);
    al_backend_free(w->be);
    al_metrics_free(w->met.reg);
}

int cmd_train(int argc, char **argv)
{
    train_cli cli;
    int rc = train_cli_parse(&cli, argc, argv);
    al_trainer_config tc;
    if (rc < 0) rc = train_cli_settings(&cli, &tc);
    if (rc >= 0) return rc;
    train_worker w = {.o = &cli.o, .batch_step = -1};
    al_stage_init(&w.st, COMP, "the trainer stopped on an error", 1);
    rc = train_worker_open(&w, &tc);
    if (rc < 0) {
        const char *outs[] = {cli.o.policy_topic, NULL};
        al_stage_spec spec = {
            .common = &cli.common,
            .group = cli.o.group,
            .input = cli.o.input_topic,
            .outputs = outs,
            .metrics = w.met.reg,
            .poll_ms = 100,
            .drain_s = (double)cli.drain_s,
            .hooks = &train_hooks,
            .ud = &w,
        };
        rc = al_stage_run(&w.st, &spec);
    }
    train_worker_close(&w);
    return rc;
}
