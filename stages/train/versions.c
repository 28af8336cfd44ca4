/*
 * versions.c: what makes a version visible: its weights under --out (a full checkpoint every
 * --checkpoint-every updates, the weights and config alone in between, old ones pruned to
 * --keep), the URI a server loads them from, and the PolicyVersion sent to the policy topic
 * keyed by the model name (see main.c for when its chunks' offsets are stored).
 *
 * Every version's directory --out/step-N/ is a Hugging Face model directory: config.json,
 * model.safetensors (f32, Hugging Face's tensor names) and the tokenizer files of --tokenizer
 * (default --model; al_checkpoint_companions), so that transformers' from_pretrained, vLLM
 * and SGLang load it as it is (`arclight sync` hands them its path). The PolicyVersion's
 * checkpoint_uri names that directory (ending in '/'); `arclight serve --follow-policy`
 * fetches model.safetensors from it, as it always did.
 */
#include "train.h"

#include "avro/codec.h"
#include "core/cli.h"
#include "core/log.h"
#include "core/sha256.h"
#include "core/util.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Removes weights-only snapshots (step-N without trainer_state.json) older than the newest
 * `keep` versions; full checkpoints are pruned by al_checkpoint_prune. */
static void prune_snapshots(train_worker *w)
{
    if (w->o->keep <= 0) return;
    for (int64_t v = w->version - w->o->keep; v >= 1 && v > w->version - w->o->keep - 64; v--) {
        char d[PATH_MAX + 64], f[PATH_MAX + 96];
        struct stat sb;
        snprintf(d, sizeof d, "%s/step-%" PRId64, w->out_abs, v);
        snprintf(f, sizeof f, "%s/trainer_state.json", d);
        if (stat(f, &sb) == 0 || stat(d, &sb) != 0) continue;
        snprintf(f, sizeof f, "%s/model.safetensors", d);
        unlink(f);
        snprintf(f, sizeof f, "%s/config.json", d);
        unlink(f);
        for (size_t i = 0; al_checkpoint_companions[i]; i++) {
            snprintf(f, sizeof f, "%s/%s", d, al_checkpoint_companions[i]);
            unlink(f);
        }
        rmdir(d);
    }
}

void train_version_uri(train_worker *w, int64_t version, char *out, size_t outlen)
{
    if (w->http) {
        char host[256];
        int port;
        al_cli_parse_hostport(w->o->listen, host, sizeof host, &port);
        if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !*host) {
            if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "127.0.0.1");
        }
        int v6 = strchr(host, ':') != NULL;
        snprintf(out, outlen, "http://%s%s%s:%d/checkpoints/step-%" PRId64 "/", v6 ? "[" : "", host,
                 v6 ? "]" : "", al_ckpt_http_port(w->http), version);
    } else {
        snprintf(out, outlen, "file://%s/step-%" PRId64 "/", w->out_abs, version);
    }
}

/* Sends a PolicyVersion for `version` (weights sha) with stats; opaque goes to the delivery
 * callback. 0 or -1 with errstr. */
int train_version_publish(train_worker *w, int64_t version, int64_t batch_step, const char *sha,
                          const al_train_stats *st, double reward_mean, int64_t batch_policy,
                          void *opaque, char *errstr, size_t errlen)
{
    char uri[PATH_MAX + 128];
    train_version_uri(w, version, uri, sizeof uri);
    al_metric extra[16];
    size_t ne = 0;
#define EXTRA(n, v) extra[ne].name = (n), extra[ne].value = (v), ne++
    EXTRA("pg_loss", st->pg_loss);
    EXTRA("dual_clip_fraction", st->dual_clip_frac);
    EXTRA("ratio_mean", st->ratio_mean);
    EXTRA("ratio_max", st->ratio_max);
    EXTRA("tis_mean", st->tis_mean);
    EXTRA("grad_norm_max", st->grad_norm_max);
    EXTRA("lr", st->lr);
    EXTRA("trained_tokens", st->tokens);
    EXTRA("sequences", st->seqs);
    EXTRA("step_tokens", (double)st->step_tokens);
    EXTRA("seconds", st->seconds);
    EXTRA("optimizer_step", (double)st->step);
    EXTRA("batch_step", (double)batch_step);
    EXTRA("batch_policy_version", (double)batch_policy);
    if (isfinite(reward_mean)) EXTRA("reward_mean", reward_mean);
#undef EXTRA
    al_policy_version pv = {
        .model = w->o->model_name,
        .version = version,
        .step = batch_step,
        .checkpoint_uri = uri,
        .sha256 = sha,
        .created_us = al_now_us(),
        .metrics = {.loss = st->loss, .kl = st->kl, .entropy = st->entropy,
                    .clip_fraction = st->clip_frac, .grad_norm = st->grad_norm,
                    .tokens_per_s = st->tokens_per_s, .extra = extra, .n_extra = ne},
    };
    al_buf b = {0};
    if (al_policy_version_encode(&pv, &b, errstr, errlen) != 0) {
        al_buf_free(&b);
        return -1;
    }
    al_kafka_out out = {
        .topic = w->o->policy_topic,
        .partition = AL_KAFKA_PARTITION_ANY,
        .key = w->o->model_name,
        .keylen = strlen(w->o->model_name),
        .value = b.data,
        .len = b.len,
        .opaque = opaque,
    };
    rd_kafka_resp_err_t err = al_producer_produce(al_stage_producer(&w->st), &out);
    al_buf_free(&b);
    if (err) {
        al_err(errstr, errlen, "cannot send PolicyVersion %" PRId64 " to %s: %s", version,
               w->o->policy_topic, rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

void train_version_stats_json(const al_train_stats *st, train_worker *w, int64_t batch_step,
                              int64_t batch_policy, double reward_mean, char *out, size_t outlen)
{
    /* JSON has no NaN: a missing reward is null, other non-finite values 0 */
    char rew[48] = "null";
    if (isfinite(reward_mean)) snprintf(rew, sizeof rew, "%.9g", reward_mean);
#define F(x) (isfinite(x) ? (x) : 0.0)
    snprintf(out, outlen,
             "{\"model\": \"%s\", \"version\": %" PRId64 ", \"batch_step\": %" PRId64
             ", \"batch_policy_version\": %" PRId64
             ", \"loss\": %.9g, \"pg_loss\": %.9g, \"kl\": %.9g, \"entropy\": %.9g, \"clip_fraction\": %.9g"
             ", \"grad_norm\": %.9g, \"lr\": %.9g, \"tokens_per_s\": %.9g, \"trained_tokens\": %.0f"
             ", \"reward_mean\": %s}",
             w->o->model_name, w->version, batch_step, batch_policy, F(st->loss), F(st->pg_loss),
             F(st->kl), F(st->entropy), F(st->clip_frac), F(st->grad_norm), F(st->lr),
             F(st->tokens_per_s), F(st->tokens), rew);
#undef F
}

/* Copies the tokenizer files of --tokenizer (default --model) into the version's directory
 * dir. Says once when there are none (the directory then loads in arclight serve, which takes
 * its tokenizer from its own --model, but not in vLLM or SGLang). 0 or -1 with errstr. */
static int copy_tokenizer(train_worker *w, const char *dir, char *errstr, size_t errlen)
{
    static int warned;
    const char *from = w->o->tok_dir ? w->o->tok_dir : w->o->model_dir;
    int n = al_checkpoint_copy_companions(from, dir, errstr, errlen);
    if (n < 0) return -1;
    if (n == 0 && !warned) {
        warned = 1;
        al_log_warn(COMP, "%s holds no tokenizer files: the versions' directories will not load "
                          "in vLLM or SGLang (give --tokenizer DIR)", from);
    }
    return 0;
}

/* Writes the weights of the current version: a full checkpoint or a weights-only snapshot,
 * with the tokenizer beside them. Fills sha. 0 or -1 with errstr. */
int train_version_save(train_worker *w, int full, const char *metrics, char sha[65],
                       char *errstr, size_t errlen)
{
    if (full) {
        al_checkpoint_info info;
        if (al_checkpoint_save(w->tr, w->out_abs, w->version, metrics, &info, errstr, errlen) != 0)
            return -1;
        memcpy(sha, info.weights_sha256, 65);
        if (copy_tokenizer(w, info.dir, errstr, errlen) != 0) return -1;
        w->last_full = w->version;
        char e[256];
        if (w->o->keep > 0 && al_checkpoint_prune(w->out_abs, (int)w->o->keep, e, sizeof e) < 0)
            al_log_warn(COMP, "pruning checkpoints: %s", e);
    } else {
        char dir[PATH_MAX + 64], file[PATH_MAX + 96];
        snprintf(dir, sizeof dir, "%s/step-%" PRId64, w->out_abs, w->version);
        if (al_model_save_dir(w->policy, dir, AL_ST_DTYPE_F32, errstr, errlen) != 0 ||
            copy_tokenizer(w, dir, errstr, errlen) != 0)
            return -1;
        snprintf(file, sizeof file, "%s/model.safetensors", dir);
        if (al_sha256_file(file, sha, errstr, errlen) != 0) return -1;
    }
    prune_snapshots(w);
    return 0;
}

