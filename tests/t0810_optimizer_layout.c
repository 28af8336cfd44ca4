/* t0810: the layout of a checkpoint's optimizer.safetensors, as docs/TRAINING.md documents
 * it, read by another tool. For the reference Qwen2 model (qkv biases, tied embeddings) and
 * the Qwen3 one (q/k norms, an lm_head of its own), two real training steps (lib/model's
 * trainer, SFT on a packed chunk of two sequences, gradient clipping on) and a checkpoint;
 * then tests/t0810_optimizer_layout.py, which knows only the documentation, maps every
 * moment to its Hugging Face tensor and compares it with torch.optim.AdamW run on the same
 * steps. If the file's layout changes without the documentation, this fails. */
#include "testlib.h"
#include "support.h"

#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/trainer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *src_dir(void)
{
    const char *s = getenv("ARCLIGHT_SOURCE_DIR");
    return s && *s ? s : ".";
}

/* Trains `steps` steps on one chunk, checkpoints under a fresh directory, and runs the
 * reader on it. Returns the reader's exit status (-1 when the run itself failed). */
static int run_case(const char *model, int steps)
{
    char err[1200], mdir[1024], root[256], cmd[4096];
    snprintf(mdir, sizeof mdir, "%s/tests/model/%s", src_dir(), model);
    if (!al_test_tmpdir(root, sizeof root, "t0810")) return -1;
    al_model *policy = al_model_load_dir(mdir, err, sizeof err);
    if (!policy) {
        fprintf(stderr, "  %s\n", err);
        return -1;
    }
    al_trainer_config tc;
    al_trainer_config_default(&tc);
    tc.loss.kind = AL_LOSS_SFT;
    tc.loss.agg = AL_LOSS_AGG_TOKEN_MEAN;
    tc.optim.lr = 1e-2f;
    tc.optim.beta1 = 0.9f;
    tc.optim.beta2 = 0.95f;
    tc.optim.weight_decay = 0.1f;
    tc.optim.grad_clip = 1.0f;
    al_trainer *tr = al_trainer_new(policy, NULL, &tc, err, sizeof err);
    if (!tr) {
        fprintf(stderr, "  %s\n", err);
        al_model_free(policy);
        return -1;
    }
    /* two sequences, 7 and 5 tokens; the first token of each is not trained */
    static const int32_t tokens[12] = {1, 17, 42, 99, 3, 250, 8, 2, 77, 13, 13, 200};
    static const int32_t cu[3] = {0, 7, 12};
    static const float mask[12] = {0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 1};
    al_train_chunk ch = {.T = 12, .nseq = 2, .tokens = tokens, .cu_seqlens = cu, .mask = mask};
    int rc = -1;
    for (int s = 0; s < steps; s++) {
        al_train_stats st;
        if (al_trainer_step(tr, &ch, 1, &st, err, sizeof err)) {
            fprintf(stderr, "  step %d: %s\n", s, err);
            goto out;
        }
    }
    al_checkpoint_info info;
    if (al_checkpoint_save(tr, root, steps, NULL, &info, err, sizeof err)) {
        fprintf(stderr, "  %s\n", err);
        goto out;
    }
    char chunk[512];
    snprintf(chunk, sizeof chunk, "%s/chunk.json", root);
    FILE *f = fopen(chunk, "w");
    if (!f) goto out;
    fprintf(f, "{\"steps\": %d, \"tokens\": [", steps);
    for (int i = 0; i < 12; i++)
        fprintf(f, "%s%d", i ? ", " : "", tokens[i]);
    fprintf(f, "], \"cu_seqlens\": [0, 7, 12], \"mask\": [");
    for (int i = 0; i < 12; i++)
        fprintf(f, "%s%g", i ? ", " : "", mask[i]);
    fprintf(f, "]}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/t0810_optimizer_layout.py' '%s' '%s' '%s'",
             src_dir(), info.dir, mdir, chunk);
    int st = system(cmd);
    rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (al_test_rmtree(root) != 0) fprintf(stderr, "  could not remove %s\n", root);
out:
    al_trainer_free(tr);
    al_model_free(policy);
    return rc;
}

TEST(qwen2_tied_embeddings_and_biases)
{
    int rc = run_case("ref-qwen2", 2);
    CHECKF(rc == 0, "the documented reader of optimizer.safetensors failed (%d)", rc);
}

TEST(qwen3_qk_norms_and_an_lm_head)
{
    int rc = run_case("ref-qwen3", 2);
    CHECKF(rc == 0, "the documented reader of optimizer.safetensors failed (%d)", rc);
}
