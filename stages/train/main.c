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
 * from their chunks), ckpt_http.c (GET /checkpoints/ on --listen), tboard.c (--tensorboard
 * events); train.h is what they share.
 */
#include "assembler.h"
#include "ckpt_http.h"
#include "train.h"

#include "avro/codec.h"
#include "core/cli.h"
#include "core/fault.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/util.h"
#include "core/vec.h"
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
    for (int k = 0; k < AL_TRAIN_CALL_POSITIONS; k++) {
        char pos[8];
        snprintf(pos, sizeof pos, "%d", k);
        m->call_entropy[k] = al_metrics_gauge(
            r, "arclight_train_call_entropy",
            "The sampler's entropy per token of the last step's k-th calls (mean -logprob of the "
            "sampled tokens)",
            "call", pos, NULL);
    }
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

/* A trainer setting given as a flag: its al_trainer_config_set key and value. */
typedef struct train_setting {
    const char *key, *value;
} train_setting;
typedef AL_VEC(train_setting) train_settings;

/* A setting flag's row: --NAME stands for the setting key (its '_' written '-'). */
typedef struct train_setting_flag {
    const char *name, *key, *arg, *help;
} train_setting_flag;

static const train_setting_flag setting_flags[] = {
    {"loss", "loss", "ppo|gspo|cispo|sft", "the loss (default ppo)"},
    {"loss-agg", "loss_agg", "token-mean|seq-mean-token-sum|seq-mean-token-mean",
     "how the loss is averaged (default token-mean)"},
    {"eps-low", "eps_low", "E", "clip range below (default 0.2)"},
    {"eps-high", "eps_high", "E",
     "clip range above (default 0.2; eps-high > eps-low: clip-higher)"},
    {"dual-clip", "dual_clip", "C", "dual clip for negative advantages, C > 1 (default 0: off)"},
    {"tis-cap", "tis_cap", "C", "truncated importance sampling vs the sampler (0: off)"},
    {"kl", "kl", "k1|k2|k3", "KL estimator to the reference model (default k3)"},
    {"kl-beta", "kl_beta", "B", "KL coefficient (default 0)"},
    {"entropy-coef", "entropy_coef", "C", "entropy bonus (default 0)"},
    {"temperature", "temperature", "T", "the sampler's temperature (default 1)"},
    {"lr", "lr", "LR", "AdamW's learning rate (default 1e-6)"},
    {"beta1", "beta1", "B", "AdamW's beta1"},
    {"beta2", "beta2", "B", "AdamW's beta2"},
    {"adam-eps", "adam_eps", "E", "AdamW's epsilon"},
    {"weight-decay", "weight_decay", "W", "AdamW's weight decay (default 0.01)"},
    {"decay-1d", "decay_1d", "0|1", "decay norms and biases too"},
    {"grad-clip", "grad_clip", "G", "max global gradient norm (default 1; 0: off)"},
    {"lr-schedule", "lr_schedule", "S", "the learning rate's schedule: constant or cosine"},
    {"warmup-steps", "warmup_steps", "N", "steps of the schedule's warm-up"},
    {"total-steps", "total_steps", "N", "steps of the whole schedule"},
    {"min-lr-ratio", "min_lr_ratio", "R", "the schedule's lowest learning rate, over --lr"},
    {"ppo-epochs", "ppo_epochs", "N", "passes over each step (alias --epochs)"},
    {"epochs", "ppo_epochs", "N", "the same as --ppo-epochs"},
    {"mini-batches", "mini_batches", "N", "updates per step"},
};
#define N_SETTING_FLAGS AL_ARRAY_LEN(setting_flags)

/* Where a setting flag's value goes: its key, and the list the values keep their order in. */
typedef struct train_setting_dest {
    const char *key;
    train_settings *given;
} train_setting_dest;

/* The command line as parsed: the options, the common flags, the trainer settings given as
 * flags (applied after --train-config, in their order) and the drain timeout. */
typedef struct train_cli {
    train_opts o;
    al_cli_common common;
    train_settings given;
    train_setting_dest dests[N_SETTING_FLAGS];
    int64_t drain_s;
    char namebuf[PATH_MAX];       /* the default --model-name */
    char groupbuf[PATH_MAX + 32]; /* the default --group */
} train_cli;

/* A setting flag (AL_FLAG_FUNC): its value joins the list, checked once the defaults and
 * --train-config are in (train_cli_settings). */
static int train_setting_given(void *dest, const char *value, char *err, size_t errlen)
{
    train_setting_dest *d = dest;
    if (al_vec_push(d->given, ((train_setting){d->key, value})) != 0)
        return snprintf(err, errlen, "is one setting too many (out of memory)"), -1;
    return 0;
}

static const char *const device_choices[] = {"cuda", "cpu", "auto", NULL};

/* Parses argv into cli (which it initializes; al_vec_free(&cli->given) once the settings
 * are applied) by the flag table (the fixed flags, then one row per setting flag), then
 * checks the names. -1: go on;
 * otherwise the exit code (--help, or a usage error already printed). */
static int train_cli_parse(train_cli *cli, int argc, char **argv)
{
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
        .diverge_rank = -1,
        .diverge_version = -1,
    };
    cli->drain_s = AL_STAGE_DRAIN_DEFAULT_S;
    const al_flag fixed[] = {
        {"model", 0, AL_FLAG_STRING, &o->model_dir, .arg = "DIR",
         .help = "initial weights (config.json + model.safetensors); also the\n"
                 "frozen reference model when --kl-beta > 0"},
        {"tokenizer", 0, AL_FLAG_STRING, &o->tok_dir, .arg = "DIR",
         .help = "where each version's tokenizer files come from (default\n"
                 "--model): copied beside its weights, so that the version's\n"
                 "directory loads in transformers, vLLM and SGLang"},
        {"out", 0, AL_FLAG_STRING, &o->out_dir, .arg = "DIR",
         .help = "versions go to DIR/step-N/ (N = version)"},
        {"model-wait", 0, AL_FLAG_INT, &o->model_wait, .lo = 0, .hi = 86400, .arg = "S",
         .help = "wait up to S seconds (default 0) for --model to be written\n"
                 "(config.json + model.safetensors): a job that writes it may\n"
                 "still be running when this starts (docker-compose.yml)"},
        {"resume", 0, AL_FLAG_SWITCH, &o->resume,
         .help = "continue from the newest full checkpoint in --out (without\n"
                 "it, --out must hold no checkpoint)"},
        {"model-name", 0, AL_FLAG_STRING, &o->model_name, .arg = "NAME",
         .help = "model name of the chunks and versions (default: basename\nof --model)"},
        {"checkpoint-every", 0, AL_FLAG_I64, &o->checkpoint_every, .lo = 1, .hi = INT64_MAX,
         .arg = "N",
         .help = "full checkpoint (weights + optimizer + state) every N updates;\n"
                 "weights only in between (default 1)"},
        {"keep", 0, AL_FLAG_I64, &o->keep, .lo = 0, .hi = INT64_MAX, .arg = "N",
         .help = "keep the newest N versions on disk (default 5; 0: all)"},
        {"listen", 0, AL_FLAG_STRING, &o->listen, .arg = "HOST:PORT",
         .help = "serve GET /checkpoints/... there (port 0: any free one) and\n"
                 "publish http:// URIs; without it, file:// URIs"},
        {"tensorboard", 0, AL_FLAG_STRING, &o->tensorboard, .arg = "DIR",
         .help = "write each update's loss, KL, entropy, clip fraction,\n"
                 "tokens/s and lag as TensorBoard event files there (made\n"
                 "if missing; default: none)"},
        {"train-config", 0, AL_FLAG_STRING, &o->train_config, .arg = "FILE",
         .help = "trainer settings as a JSON object (flags below override;\n"
                 "unknown members are ignored)"},
        {"input-topic", 0, AL_FLAG_STRING, &o->input_topic, .arg = "T",
         .help = "default arclight.batches"},
        {"policy-topic", 0, AL_FLAG_STRING, &o->policy_topic, .arg = "T",
         .help = "default arclight.policy"},
        {"group", 0, AL_FLAG_STRING, &o->group, .arg = "ID",
         .help = "consumer group (default arclight-train-NAME)"},
        {"steps", 0, AL_FLAG_I64, &o->stop_after, .lo = 1, .hi = INT64_MAX, .arg = "N",
         .help = "stop at version N (checkpointed and acknowledged: exit 0)"},
        {"device", 0, AL_FLAG_STRING, &o->device, .arg = "cuda|cpu|auto",
         .choices = device_choices,
         .help = "where the model trains (default auto: cuda when this build\n"
                 "has the CUDA backend and a device is visible, else cpu)"},
        {"drain-timeout", 0, AL_FLAG_I64, &cli->drain_s, .lo = 0, .hi = INT64_MAX, .arg = "S",
         .help = "on SIGTERM, after the exit checkpoint, at most S seconds\n"
                 "(default 15) to publish, commit and leave the group,\n"
                 "whether or not Kafka answers"},
    };
    al_flag flags[AL_ARRAY_LEN(fixed) + N_SETTING_FLAGS];
    size_t n = 0;
    for (size_t i = 0; i < AL_ARRAY_LEN(fixed); i++) flags[n++] = fixed[i];
    for (size_t i = 0; i < N_SETTING_FLAGS; i++) {
        const train_setting_flag *sf = &setting_flags[i];
        cli->dests[i] = (train_setting_dest){sf->key, &cli->given};
        flags[n++] = (al_flag){sf->name, 0, AL_FLAG_FUNC, &cli->dests[i], .arg = sf->arg,
                               .help = sf->help, .parse = train_setting_given};
    }
    const al_cmd_spec spec = {
        "train", "--model DIR --out CKPT_DIR [flags]",
        "Trains a policy on the steps of arclight.batches (BatchChunk) for its model and\n"
        "publishes a PolicyVersion to arclight.policy after each update.\n",
        flags, n, .common = 1};
    int first;
    int rc = al_flags_parse(&spec, &cli->common, argc, argv, &first);
    if (rc != AL_FLAGS_GO) return rc;
    if (first < argc) return al_cli_usage_error("train", "unexpected argument '%s'", argv[first]);
    if (!o->model_dir) return al_cli_usage_error("train", "--model DIR is required");
    if (!o->out_dir) return al_cli_usage_error("train", "--out CKPT_DIR is required");
    if (!o->model_name) {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s", o->model_dir);
        size_t len = strlen(tmp);
        while (len > 1 && tmp[len - 1] == '/') tmp[--len] = '\0';
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
    for (size_t i = 0; i < cli->given.n; i++) {
        const train_setting *st = &cli->given.v[i];
        if (al_trainer_config_set(tc, st->key, st->value, err, sizeof err) != 0)
            return al_cli_usage_error("train", "%s", err);
    }
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
    /* "RANK:VERSION": that rank's weights are changed after that version, so that the
     * group's comparison of the replicas' weights (steps.c) has something to find. */
    const char *diverge = al_fault_spec("ARCLIGHT_TRAIN_TEST_DIVERGE_AT");
    if (diverge && sscanf(diverge, "%d:%" SCNd64, &cli->o.diverge_rank, &cli->o.diverge_version) != 2)
        cli->o.diverge_rank = -1, cli->o.diverge_version = -1;
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
    if (!al_model_dir_ready(o->model_dir) && o->model_wait > 0) {
        al_log_info(COMP, "waiting up to %d s for the model in %s", o->model_wait, o->model_dir);
        if (al_model_dir_wait(o->model_dir, o->model_wait, err, sizeof err) != 0) {
            al_log_error(COMP, "%s", err);
            return AL_EXIT_FAILURE;
        }
    }
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
    al_tb_close(&w->tb);
}

int cmd_train(int argc, char **argv)
{
    train_cli cli;
    int rc = train_cli_parse(&cli, argc, argv);
    al_trainer_config tc;
    if (rc < 0) rc = train_cli_settings(&cli, &tc);
    al_vec_free(&cli.given); /* in tc now */
    if (rc >= 0) return rc;
    train_worker w = {.o = &cli.o, .batch_step = -1};
    al_stage_init(&w.st, COMP, "the trainer stopped on an error", 1);
    rc = train_worker_open(&w, &tc);
    if (rc < 0) {
        const char *outs[] = {cli.o.policy_topic, NULL};
        /* A trainer that loses its partitions stops (on_rebalance): on the embedded broker a
         * 4 s session lost them at a load average of 100 (docs/RELIABILITY.md). */
        static const char *const conf_defaults[] = {AL_KAFKA_EMBEDDED_SESSION, "10000", NULL};
        al_stage_spec spec = {
            .common = &cli.common,
            .group = cli.o.group,
            .input = cli.o.input_topic,
            .outputs = outs,
            .conf_defaults = conf_defaults,
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
