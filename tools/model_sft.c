/*
 * model_sft.c: `arclight model sft`, a supervised warm start from a file, before RL.
 *
 *   arclight model sft --model DIR --data FILE --out DIR [--tokenizer DIR] [--steps N]
 *                      [--batch B] [--lr LR] [--seed S] [--epochs E]
 *
 * FILE is JSONL, one conversation per line, {"messages": [{"role": "user", "content":
 * "..."}, ..., {"role": "assistant", "content": "..."}]}: the last message is the target
 * (an assistant message), everything before it the prompt, rendered with the tokenizer's
 * chat template and its generation prompt exactly as `arclight serve` renders a request, so
 * the model learns what it will be asked. The target is the content's tokens and the end of
 * turn (<|im_end|>, else the tokenizer's eos). Each step packs B conversations (in a seeded
 * shuffled order, epoch after epoch) into one micro-batch and makes one AdamW update on the
 * SFT loss (token mean of -log p over the targets), the learning rate decaying to 0 on a
 * cosine; the loss is printed every 10 steps and
 * the weights written to --out (config.json + model.safetensors, f32) at the end. Bad lines
 * are errors naming the line; nothing is skipped.
 */
#include "core/cli.h"
#include "core/util.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "text/tokenizer.h"
#include "model/trainer.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sft_example {
    int32_t *ids; /* prompt then target */
    int n, nprompt;
} sft_example;

static const char sft_usage[] =
    "usage: arclight model sft --model DIR --data FILE --out DIR [flags]\n"
    "Supervised fine-tuning from a JSONL file of conversations ({\"messages\": [...]}, the\n"
    "last one the assistant's target), rendered with the tokenizer's chat template.\n"
    "  --model DIR       the weights to start from (config.json + model.safetensors)\n"
    "  --tokenizer DIR   tokenizer.json dir (default: --model)\n"
    "  --data FILE       the conversations\n"
    "  --out DIR         where the tuned weights go\n"
    "  --steps N         updates (default: --epochs passes over the data)\n"
    "  --epochs E        passes over the data when --steps is not given (default 1)\n"
    "  --batch B         conversations per update (default 16)\n"
    "  --lr LR           AdamW learning rate, decayed to 0 on a cosine (default 1e-3)\n"
    "  --seed S          order of the conversations (default 1)\n";

static uint64_t sm64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int parse_role(const char *s, al_chat_role *r)
{
    if (!s) return -1;
    if (!strcmp(s, "system")) *r = AL_CHAT_SYSTEM;
    else if (!strcmp(s, "user")) *r = AL_CHAT_USER;
    else if (!strcmp(s, "assistant")) *r = AL_CHAT_ASSISTANT;
    else if (!strcmp(s, "tool")) *r = AL_CHAT_TOOL;
    else return -1;
    return 0;
}

/* One line into an example. 0, or -1 with errstr. */
static int sft_line(const al_tokenizer *tok, int32_t end_id, const char *line, size_t len,
                    sft_example *ex, char *errstr, size_t errlen)
{
    json_error_t je;
    json_t *j = json_loadb(line, len, 0, &je);
    json_t *msgs = j ? json_object_get(j, "messages") : NULL;
    size_t n = json_array_size(msgs);
    if (!j || !json_is_array(msgs) || n < 2) {
        json_decref(j);
        return al_err(errstr, errlen, "%s", j ? "wants {\"messages\": [at least 2 messages]}"
                                              : je.text);
    }
    al_chat_message *m = calloc(n, sizeof *m);
    int rc = -1;
    al_token_ids ids = {0};
    if (!m) {
        al_err(errstr, errlen, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(msgs, i);
        if (parse_role(json_string_value(json_object_get(x, "role")), &m[i].role) ||
            !json_is_string(json_object_get(x, "content"))) {
            al_err(errstr, errlen, "message %zu needs a role (system, user, assistant, tool) "
                                   "and a string content", i);
            goto out;
        }
        m[i].content = json_string_value(json_object_get(x, "content"));
    }
    if (m[n - 1].role != AL_CHAT_ASSISTANT) {
        al_err(errstr, errlen, "the last message is the target and must be the assistant's");
        goto out;
    }
    al_chat_request req = {.messages = m, .n_messages = n - 1, .add_generation_prompt = 1};
    if (al_chat_encode(tok, &req, &ids, errstr, errlen)) goto out;
    size_t np = ids.len;
    const char *t = m[n - 1].content;
    if (al_tokenizer_encode(tok, t, strlen(t), 0, &ids)) {
        al_err(errstr, errlen, "out of memory");
        goto out;
    }
    ex->nprompt = (int)np;
    ex->n = (int)ids.len + 1;
    ex->ids = malloc((size_t)ex->n * sizeof *ex->ids);
    if (!ex->ids) {
        al_err(errstr, errlen, "out of memory");
        goto out;
    }
    memcpy(ex->ids, ids.ids, ids.len * sizeof *ex->ids);
    ex->ids[ex->n - 1] = end_id;
    rc = 0;
out:
    al_token_ids_free(&ids);
    free(m);
    json_decref(j);
    return rc;
}

int model_sft(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},  {"tokenizer", required_argument, 0, 't'},
        {"data", required_argument, 0, 'd'},   {"out", required_argument, 0, 'o'},
        {"steps", required_argument, 0, 'n'},  {"epochs", required_argument, 0, 'e'},
        {"batch", required_argument, 0, 'b'},  {"lr", required_argument, 0, 'l'},
        {"seed", required_argument, 0, 's'},   {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *model_dir = NULL, *tok_dir = NULL, *data = NULL, *out = NULL;
    long steps = 0, epochs = 1, batch = 16;
    unsigned long long seed = 1;
    const char *lr = "1e-3";
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 't': tok_dir = optarg; break;
        case 'd': data = optarg; break;
        case 'o': out = optarg; break;
        case 'l': lr = optarg; break;
        case 'n':
        case 'e':
        case 'b': {
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno || *end || v < 1 || v > 10000000)
                return al_cli_usage_error("model sft", "--%s wants a positive integer, got '%s'",
                                          c == 'n' ? "steps" : c == 'e' ? "epochs" : "batch", optarg);
            *(c == 'n' ? &steps : c == 'e' ? &epochs : &batch) = v;
            break;
        }
        case 's':
            errno = 0;
            seed = strtoull(optarg, &end, 10);
            if (errno || *end || optarg[0] == '-')
                return al_cli_usage_error("model sft", "--seed wants an unsigned integer");
            break;
        case 'h': fputs(sft_usage, stdout); return AL_EXIT_OK;
        default: return al_cli_usage_error("model sft", "unknown option (see --help)");
        }
    }
    if (optind < argc)
        return al_cli_usage_error("model sft", "unexpected argument '%s'", argv[optind]);
    if (!model_dir || !data || !out)
        return al_cli_usage_error("model sft", "--model, --data and --out are required");
    if (!tok_dir) tok_dir = model_dir;

    char err[1024];
    int rc = AL_EXIT_FAILURE;
    al_model *m = NULL;
    al_tokenizer *tok = NULL;
    al_trainer *tr = NULL;
    sft_example *ex = NULL;
    size_t nex = 0, cap = 0, *order = NULL;
    char *text = NULL;
    int32_t *tokens = NULL, *cu = NULL;
    float *mask = NULL;
    if (!(tok = al_tokenizer_load_dir(tok_dir, err, sizeof err)) ||
        !(m = al_model_load_dir(model_dir, err, sizeof err))) {
        fprintf(stderr, "arclight model sft: %s\n", err);
        goto out;
    }
    int32_t end_id = al_tokenizer_token_to_id(tok, "<|im_end|>", 10);
    if (end_id < 0) end_id = al_tokenizer_eos_id(tok);
    size_t len;
    if (!(text = al_file_read(data, &len, err, sizeof err))) {
        fprintf(stderr, "arclight model sft: %s\n", err);
        goto out;
    }
    int lineno = 0;
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t e = nl ? (size_t)(nl - text) : len, n = e - pos;
        const char *line = text + pos;
        pos = e + 1;
        lineno++;
        while (n && (line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
        if (!n || line[0] == '#') continue;
        if (nex == cap) {
            cap = cap ? cap * 2 : 256;
            sft_example *ne = realloc(ex, cap * sizeof *ne);
            if (!ne) goto oom;
            ex = ne;
        }
        if (sft_line(tok, end_id, line, n, &ex[nex], err, sizeof err)) {
            fprintf(stderr, "arclight model sft: %s:%d: %s\n", data, lineno, err);
            goto out;
        }
        nex++;
    }
    if (!nex) {
        fprintf(stderr, "arclight model sft: %s holds no conversations\n", data);
        goto out;
    }
    if (batch > (long)nex) batch = (long)nex;
    if (!steps) steps = (long)((nex * (size_t)epochs + (size_t)batch - 1) / (size_t)batch);

    al_trainer_config cfg;
    al_trainer_config_default(&cfg);
    char total[32];
    snprintf(total, sizeof total, "%ld", steps);
    /* cosine decay to 0 over the run: the last updates are small, so the result is not
     * pulled towards the last few batches' examples */
    if (al_trainer_config_set(&cfg, "loss", "sft", err, sizeof err) ||
        al_trainer_config_set(&cfg, "lr", lr, err, sizeof err) ||
        al_trainer_config_set(&cfg, "lr_schedule", "cosine", err, sizeof err) ||
        al_trainer_config_set(&cfg, "total_steps", total, err, sizeof err) ||
        !(tr = al_trainer_new(m, NULL, &cfg, err, sizeof err))) {
        fprintf(stderr, "arclight model sft: %s\n", err);
        goto out;
    }
    if (!(order = malloc(nex * sizeof *order))) goto oom;
    for (size_t i = 0; i < nex; i++)
        order[i] = i;
    uint64_t rs = seed;
    size_t at = nex; /* position in the current shuffled pass */
    size_t maxtok = 0;
    for (size_t i = 0; i < nex; i++)
        maxtok = (size_t)ex[i].n > maxtok ? (size_t)ex[i].n : maxtok;
    size_t tcap = maxtok * (size_t)batch;
    tokens = malloc(tcap * sizeof *tokens);
    mask = malloc(tcap * sizeof *mask);
    cu = malloc(((size_t)batch + 1) * sizeof *cu);
    if (!tokens || !mask || !cu) goto oom;
    printf("sft: %zu conversations from %s, %ld steps of %ld, lr %s\n", nex, data, steps, batch, lr);
    fflush(stdout);
    for (long s = 0; s < steps; s++) {
        int T = 0;
        cu[0] = 0;
        for (long b = 0; b < batch; b++) {
            if (at == nex) { /* next pass: a new order */
                for (size_t i = nex; i > 1; i--) {
                    size_t j = (size_t)(sm64(&rs) % i), t = order[i - 1];
                    order[i - 1] = order[j];
                    order[j] = t;
                }
                at = 0;
            }
            const sft_example *x = &ex[order[at++]];
            memcpy(tokens + T, x->ids, (size_t)x->n * sizeof *tokens);
            for (int i = 0; i < x->n; i++)
                mask[T + i] = i >= x->nprompt ? 1.0f : 0.0f;
            T += x->n;
            cu[b + 1] = T;
        }
        al_train_chunk ch = {.T = T, .nseq = (int)batch, .tokens = tokens, .cu_seqlens = cu,
                             .mask = mask};
        al_train_stats st;
        if (al_trainer_step(tr, &ch, 1, &st, err, sizeof err)) {
            fprintf(stderr, "arclight model sft: step %ld: %s\n", s + 1, err);
            goto out;
        }
        if ((s + 1) % 10 == 0 || s == 0 || s + 1 == steps) {
            printf("sft: step %ld/%ld loss %.4f grad-norm %.3f\n", s + 1, steps, st.loss,
                   st.grad_norm);
            fflush(stdout);
        }
    }
    if (al_model_save_dir(m, out, AL_ST_DTYPE_F32, err, sizeof err)) {
        fprintf(stderr, "arclight model sft: %s\n", err);
        goto out;
    }
    printf("sft: wrote %s\n", out);
    rc = AL_EXIT_OK;
    goto out;
oom:
    fprintf(stderr, "arclight model sft: out of memory\n");
out:
    for (size_t i = 0; i < nex; i++)
        free(ex[i].ids);
    free(ex);
    free(order);
    free(text);
    free(tokens);
    free(mask);
    free(cu);
    al_trainer_free(tr);
    al_model_free(m);
    al_tokenizer_free(tok);
    return rc;
}
