/*
 * checkpoint.c: ROOT/step-N checkpoints (see checkpoint.h).
 */
#include "model/checkpoint.h"

#include "core/util.h"
#include "text/json.h"
#include "model/safetensors.h"
#include "core/sha256.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_FORMAT "arclight-trainer-state"
#define STATE_VERSION 1

static const char *const ckpt_files[] = {"model.safetensors", "config.json",
                                         "optimizer.safetensors", "trainer_state.json"};

const char *const al_checkpoint_companions[] = {
    "tokenizer.json",  "tokenizer_config.json", "vocab.json",          "merges.txt",
    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
    "generation_config.json", NULL};

static int ck_err(char *errstr, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int ck_err(char *errstr, size_t errlen, const char *fmt, ...)
{
    if (errstr && errlen) {
        char msg[1536];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(errstr, errlen, "checkpoint: %s", msg);
    }
    return -1;
}

/* mkdir -p. 0, or -1 with errno set. */
static int mkdir_p(const char *path)
{
    char tmp[1024];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(tmp, path, n + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

/* Removes a checkpoint directory holding only the files a checkpoint writes. */
static void remove_ckpt_dir(const char *dir)
{
    char p[4096];
    for (size_t i = 0; i < sizeof ckpt_files / sizeof ckpt_files[0]; i++) {
        if (snprintf(p, sizeof p, "%s/%s", dir, ckpt_files[i]) >= (int)sizeof p) continue;
        unlink(p);
    }
    for (size_t i = 0; al_checkpoint_companions[i]; i++) {
        if (snprintf(p, sizeof p, "%s/%s", dir, al_checkpoint_companions[i]) >= (int)sizeof p)
            continue;
        unlink(p);
    }
    rmdir(dir);
}

int al_checkpoint_copy_companions(const char *from, const char *to, char *errstr, size_t errlen)
{
    int copied = 0;
    char src[4096], dst[4096];
    for (size_t i = 0; al_checkpoint_companions[i]; i++) {
        const char *name = al_checkpoint_companions[i];
        struct stat sb;
        if (snprintf(src, sizeof src, "%s/%s", from, name) >= (int)sizeof src ||
            snprintf(dst, sizeof dst, "%s/%s", to, name) >= (int)sizeof dst)
            return ck_err(errstr, errlen, "path too long: %s/%s", to, name);
        if (stat(src, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        size_t len = 0;
        char *text = al_file_read(src, &len, errstr, errlen);
        if (!text) return -1;
        int rc = al_file_write_atomic(dst, text, len, errstr, errlen);
        free(text);
        if (rc != 0) return -1;
        copied++;
    }
    return copied;
}

/* optimizer.safetensors: header with exp_avg and exp_avg_sq, then the moments, which are
 * one allocation (m then v) and so one write. */
static int save_optimizer(const al_adamw *opt, const char *path, char *errstr, size_t errlen)
{
    al_buf h = {0};
    size_t bytes = opt->n * sizeof(float);
    al_buf_printf(&h,
                       "{\"__metadata__\":{\"format\":\"arclight-adamw\",\"step\":\"%" PRId64
                       "\"},\"exp_avg\":{\"dtype\":\"F32\",\"shape\":[%zu],\"data_offsets\":[0,%zu]},"
                       "\"exp_avg_sq\":{\"dtype\":\"F32\",\"shape\":[%zu],\"data_offsets\":[%zu,%zu]}}",
                       opt->step, opt->n, bytes, opt->n, bytes, 2 * bytes);
    while (!h.oom && (h.len % 8) != 0) al_buf_append(&h, " ", 1);
    if (h.oom) {
        free(h.data);
        return ck_err(errstr, errlen, "out of memory writing %s", path);
    }
    size_t hlen = 8 + h.len;
    uint8_t *head = malloc(hlen);
    if (!head) {
        free(h.data);
        return ck_err(errstr, errlen, "out of memory writing %s", path);
    }
    uint64_t n = h.len;
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)(n >> (8 * i));
    memcpy(head + 8, h.data, h.len);
    free(h.data);
    int rc = al_file_write_atomic2(path, head, hlen, opt->state, 2 * bytes, errstr, errlen);
    free(head);
    return rc;
}

static int load_optimizer(al_adamw *opt, const char *path, char *errstr, size_t errlen)
{
    al_st_file f;
    if (al_st_open(&f, path, errstr, errlen) != 0) return -1;
    const char *names[2] = {"exp_avg", "exp_avg_sq"};
    float *dst[2] = {opt->m, opt->v};
    for (int i = 0; i < 2; i++) {
        const al_st_tensor *t = al_st_find(&f, names[i]);
        if (!t) {
            al_st_close(&f);
            return ck_err(errstr, errlen, "%s has no tensor %s", path, names[i]);
        }
        if (t->dtype != AL_ST_DTYPE_F32 || t->numel != opt->n) {
            al_st_close(&f);
            return ck_err(errstr, errlen,
                          "%s: %s holds %zu values of another dtype or count; the model has %zu "
                          "parameters (f32)",
                          path, names[i], t->numel, opt->n);
        }
        al_st_tensor_to_f32(t, dst[i]);
    }
    al_st_close(&f);
    return 0;
}

static int save_state(al_trainer *tr, const char *path, int64_t step, const char *sha,
                      const char *metrics_json, char *errstr, size_t errlen)
{
    const al_trainer_config *c = al_trainer_config_of(tr);
    const al_adamw *opt = al_trainer_optimizer_read(tr);
    al_buf b = {0};
    al_buf_printf(&b, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n", STATE_FORMAT,
                       STATE_VERSION);
    al_buf_printf(&b, "  \"step\": %" PRId64 ",\n  \"optimizer_step\": %" PRId64 ",\n", step,
                       opt->step);
    al_buf_printf(&b, "  \"num_params\": %zu,\n  \"weights_sha256\": \"%s\",\n", opt->n, sha);
    al_buf_printf(&b, "  \"lr_next\": %.9g,\n", al_lr_at(&opt->cfg, opt->step));
    al_buf_printf(&b,
                       "  \"loss\": {\"kind\": \"%s\", \"agg\": \"%s\", \"eps_low\": %.9g, "
                       "\"eps_high\": %.9g, \"dual_clip\": %.9g, \"tis_cap\": %.9g, \"kl\": \"%s\", "
                       "\"kl_beta\": %.9g, \"entropy_coef\": %.9g},\n",
                       al_loss_kind_name(c->loss.kind), al_loss_agg_name(c->loss.agg),
                       (double)c->loss.eps_low, (double)c->loss.eps_high, (double)c->loss.dual_clip,
                       (double)c->loss.tis_cap, al_kl_kind_name(c->loss.kl), (double)c->loss.kl_beta,
                       (double)c->loss.entropy_coef);
    const al_optim_config *o = &opt->cfg;
    al_buf_printf(&b,
                       "  \"optimizer\": {\"name\": \"adamw\", \"lr\": %.9g, \"beta1\": %.9g, "
                       "\"beta2\": %.9g, \"eps\": %.9g, \"weight_decay\": %.9g, \"grad_clip\": %.9g, "
                       "\"schedule\": \"%s\", \"warmup_steps\": %" PRId64 ", \"total_steps\": %" PRId64
                       ", \"min_lr_ratio\": %.9g},\n",
                       (double)o->lr, (double)o->beta1, (double)o->beta2, (double)o->eps,
                       (double)o->weight_decay, (double)o->grad_clip, al_lr_schedule_name(o->schedule),
                       o->warmup_steps, o->total_steps, (double)o->min_lr_ratio);
    al_buf_printf(&b, "  \"ppo_epochs\": %d,\n  \"mini_batches\": %d,\n  \"temperature\": %.9g,\n",
                       c->ppo_epochs, c->mini_batches, (double)c->temperature);
    al_buf_printf(&b, "  \"metrics\": %s\n}\n",
                       metrics_json && *metrics_json ? metrics_json : "{}");
    if (b.oom) {
        free(b.data);
        return ck_err(errstr, errlen, "out of memory writing %s", path);
    }
    /* The caller's metrics must keep the file valid JSON. */
    char perr[256];
    al_json *check = al_json_parse(b.data, b.len, perr, sizeof perr);
    if (!check) {
        free(b.data);
        return ck_err(errstr, errlen, "metrics are not a JSON value (%s)", perr);
    }
    al_json_free(check);
    int rc = al_file_write_atomic2(path, b.data, b.len, NULL, 0, errstr, errlen);
    free(b.data);
    return rc;
}

int al_checkpoint_save(al_trainer *tr, const char *root, int64_t step, const char *metrics_json,
                       al_checkpoint_info *info, char *errstr, size_t errlen)
{
    al_checkpoint_info local;
    if (!info) info = &local;
    memset(info, 0, sizeof *info);
    if (step < 0) return ck_err(errstr, errlen, "negative step %" PRId64, step);
    if (mkdir_p(root) != 0)
        return ck_err(errstr, errlen, "cannot create %s: %s", root, strerror(errno));
    char tmp[1024], path[1200];
    int n1 = snprintf(info->dir, sizeof info->dir, "%s/step-%" PRId64, root, step);
    int n2 = snprintf(tmp, sizeof tmp, "%s/step-%" PRId64 ".tmp-%ld", root, step, (long)getpid());
    if (n1 < 0 || (size_t)n1 >= sizeof info->dir || n2 < 0 || (size_t)n2 >= sizeof tmp)
        return ck_err(errstr, errlen, "path too long under %s", root);
    remove_ckpt_dir(tmp);
    if (mkdir(tmp, 0755) != 0) return ck_err(errstr, errlen, "cannot create %s: %s", tmp, strerror(errno));

    al_model *m = al_trainer_policy(tr);
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    if (al_model_save_safetensors(m, path, AL_ST_DTYPE_F32, errstr, errlen) != 0) goto fail;
    char sha[65];
    if (al_sha256_file(path, sha, errstr, errlen) != 0) goto fail;
    snprintf(path, sizeof path, "%s/config.json", tmp);
    if (al_model_config_save(al_model_config_of(m), "float32", path, errstr, errlen) != 0) goto fail;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    if (save_optimizer(al_trainer_optimizer_read(tr), path, errstr, errlen) != 0) goto fail;
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp);
    if (save_state(tr, path, step, sha, metrics_json, errstr, errlen) != 0) goto fail;

    remove_ckpt_dir(info->dir); /* a re-save of the same step replaces it */
    if (rename(tmp, info->dir) != 0) {
        ck_err(errstr, errlen, "cannot rename %s to %s: %s", tmp, info->dir, strerror(errno));
        goto fail;
    }
    info->step = step;
    info->optimizer_step = al_trainer_optimizer_read(tr)->step;
    snprintf(info->weights_path, sizeof info->weights_path, "%s/model.safetensors", info->dir);
    memcpy(info->weights_sha256, sha, sizeof sha);
    return 0;
fail:
    remove_ckpt_dir(tmp);
    return -1;
}

int al_checkpoint_load(al_trainer *tr, const char *dir, al_checkpoint_info *info, char *errstr,
                       size_t errlen)
{
    al_checkpoint_info local;
    if (!info) info = &local;
    memset(info, 0, sizeof *info);
    char path[1200];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    size_t len;
    char perr[256];
    uint8_t *text = (uint8_t *)al_file_read(path, &len, errstr, errlen);
    if (!text) return -1;
    al_json *st = al_json_parse((const char *)text, len, perr, sizeof perr);
    free(text);
    if (!st) return ck_err(errstr, errlen, "%s: %s", path, perr);
    const char *fmt = al_json_get_string(st, "format", "");
    int64_t version = al_json_get_int(st, "version", -1);
    int64_t step = al_json_get_int(st, "step", -1);
    int64_t ostep = al_json_get_int(st, "optimizer_step", -1);
    int64_t nparams = al_json_get_int(st, "num_params", -1);
    const char *want_sha = al_json_get_string(st, "weights_sha256", "");
    char sha_expected[65] = "";
    if (strlen(want_sha) == 64) memcpy(sha_expected, want_sha, 65);
    int bad_format = strcmp(fmt, STATE_FORMAT) != 0 || version != STATE_VERSION;
    al_json_free(st);
    if (bad_format)
        return ck_err(errstr, errlen, "%s is not an %s version %d file", path, STATE_FORMAT,
                      STATE_VERSION);
    if (step < 0 || ostep < 0 || nparams < 0 || !sha_expected[0])
        return ck_err(errstr, errlen,
                      "%s lacks step, optimizer_step, num_params or weights_sha256", path);
    al_adamw *opt = al_trainer_optimizer(tr);
    if ((size_t)nparams != opt->n)
        return ck_err(errstr, errlen, "%s holds %" PRId64 " parameters; this model has %zu", path,
                      nparams, opt->n);

    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char sha[65];
    if (al_sha256_file(path, sha, errstr, errlen) != 0) return -1;
    if (strcmp(sha, sha_expected) != 0)
        return ck_err(errstr, errlen, "%s: sha256 %s differs from the recorded %s (corrupt or "
                                      "replaced weights)",
                      path, sha, sha_expected);
    if (al_model_load_safetensors(al_trainer_policy(tr), path, errstr, errlen) != 0) return -1;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (load_optimizer(opt, path, errstr, errlen) != 0) return -1;
    opt->step = ostep;

    info->step = step;
    info->optimizer_step = ostep;
    snprintf(info->dir, sizeof info->dir, "%s", dir);
    snprintf(info->weights_path, sizeof info->weights_path, "%s/model.safetensors", dir);
    memcpy(info->weights_sha256, sha, sizeof sha);
    return 0;
}

int al_checkpoint_latest(const char *root, char *out, size_t outlen, int64_t *step, char *errstr,
                         size_t errlen)
{
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT) return 0;
        return ck_err(errstr, errlen, "cannot read %s: %s", root, strerror(errno));
    }
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (strncmp(name, "step-", 5) != 0) continue;
        char *end;
        errno = 0;
        long long n = strtoll(name + 5, &end, 10);
        if (errno || end == name + 5 || *end != '\0' || n < 0) continue; /* step-N.tmp-PID */
        char p[1200];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s/trainer_state.json", root, name);
        if (stat(p, &sb) != 0) continue;
        if (n > best) best = n;
    }
    closedir(d);
    if (best < 0) return 0;
    int w = snprintf(out, outlen, "%s/step-%" PRId64, root, best);
    if (w < 0 || (size_t)w >= outlen) return ck_err(errstr, errlen, "path too long under %s", root);
    if (step) *step = best;
    return 1;
}

static int cmp_i64_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x > y ? -1 : x < y;
}

int al_checkpoint_prune(const char *root, int keep, char *errstr, size_t errlen)
{
    if (keep < 1) return ck_err(errstr, errlen, "prune must keep at least 1 checkpoint (got %d)", keep);
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT) return 0;
        return ck_err(errstr, errlen, "cannot read %s: %s", root, strerror(errno));
    }
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    char p[1200];
    while ((e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (strncmp(name, "step-", 5) != 0) continue;
        char *end;
        errno = 0;
        long long v = strtoll(name + 5, &end, 10);
        if (errno || end == name + 5 || v < 0) continue;
        if (strncmp(end, ".tmp-", 5) == 0) {
            /* A save that never finished; its PID may be alive only if it is this process. */
            long pid = strtol(end + 5, NULL, 10);
            if (pid != (long)getpid()) {
                snprintf(p, sizeof p, "%s/%s", root, name);
                remove_ckpt_dir(p);
            }
            continue;
        }
        if (*end != '\0') continue;
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s/trainer_state.json", root, name);
        if (stat(p, &sb) != 0) continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            int64_t *ns = realloc(steps, nc * sizeof *ns);
            if (!ns) {
                closedir(d);
                free(steps);
                return ck_err(errstr, errlen, "out of memory");
            }
            steps = ns, cap = nc;
        }
        steps[n++] = v;
    }
    closedir(d);
    int removed = 0;
    if (n > (size_t)keep) {
        qsort(steps, n, sizeof *steps, cmp_i64_desc);
        for (size_t i = (size_t)keep; i < n; i++) {
            snprintf(p, sizeof p, "%s/step-%" PRId64, root, steps[i]);
            remove_ckpt_dir(p);
            removed++;
        }
    }
    free(steps);
    return removed;
}
