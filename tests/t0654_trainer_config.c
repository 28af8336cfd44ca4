/*
 * t0654_trainer_config: the trainer's settings by name (command line) and from a JSON config
 * file: every name reaches its field, bad names and values are refused with the reason.
 */
#include "testlib.h"

#include "model/trainer.h"

TEST(every_setting_reaches_its_field)
{
    al_trainer_config c;
    al_trainer_config_default(&c);
    char err[512];
    const char *kv[][2] = {
        {"loss", "cispo"},      {"loss_agg", "seq-mean-token-sum"}, {"eps_low", "0.1"},
        {"eps_high", "0.28"},   {"dual_clip", "3"},     {"tis_cap", "2.5"},
        {"kl", "k2"},           {"kl_beta", "0.04"},    {"entropy_coef", "-0.001"},
        {"ppo_epochs", "4"},    {"mini_batches", "8"},  {"temperature", "0.7"},
        {"decay_1d", "true"},   {"lr", "1e-5"},         {"beta1", "0.8"},
        {"beta2", "0.95"},      {"adam_eps", "1e-6"},   {"weight_decay", "0.1"},
        {"grad_clip", "0.5"},   {"lr_schedule", "cosine"}, {"warmup_steps", "10"},
        {"total_steps", "1000"}, {"min_lr_ratio", "0.05"},
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        CHECKF(al_trainer_config_set(&c, kv[i][0], kv[i][1], err, sizeof err) == 0, "%s=%s: %s",
               kv[i][0], kv[i][1], err);
    CHECK(c.loss.kind == AL_LOSS_CISPO && c.loss.agg == AL_LOSS_AGG_SEQ_MEAN_TOKEN_SUM);
    CHECK(c.loss.eps_low == 0.1f && c.loss.eps_high == 0.28f && c.loss.dual_clip == 3.0f);
    CHECK(c.loss.tis_cap == 2.5f && c.loss.kl == AL_KL_K2 && c.loss.kl_beta == 0.04f);
    CHECK(c.loss.entropy_coef == -0.001f && c.ppo_epochs == 4 && c.mini_batches == 8);
    CHECK(c.temperature == 0.7f && c.decay_1d == 1 && c.optim.lr == 1e-5f);
    CHECK(c.optim.beta1 == 0.8f && c.optim.beta2 == 0.95f && c.optim.eps == 1e-6f);
    CHECK(c.optim.weight_decay == 0.1f && c.optim.grad_clip == 0.5f);
    CHECK(c.optim.schedule == AL_LR_COSINE && c.optim.warmup_steps == 10);
    CHECK(c.optim.total_steps == 1000 && c.optim.min_lr_ratio == 0.05f);
}

TEST(bad_settings_are_refused_with_the_reason)
{
    al_trainer_config c;
    al_trainer_config_default(&c);
    char err[512];
    CHECK(al_trainer_config_set(&c, "eps", "0.2", err, sizeof err) == -1);
    CHECKF(strstr(err, "unknown setting 'eps'") && strstr(err, "eps_high"), "%s", err);
    CHECK(al_trainer_config_set(&c, "lr", "fast", err, sizeof err) == -1);
    CHECKF(strstr(err, "lr") && strstr(err, "not a number"), "%s", err);
    CHECK(al_trainer_config_set(&c, "ppo_epochs", "0", err, sizeof err) == -1);
    CHECKF(strstr(err, "ppo_epochs"), "%s", err);
    CHECK(al_trainer_config_set(&c, "ppo_epochs", "2.5", err, sizeof err) == -1);
    CHECKF(strstr(err, "not an integer"), "%s", err);
    CHECK(al_trainer_config_set(&c, "loss", "grpo", err, sizeof err) == -1);
    CHECKF(strstr(err, "loss") && strstr(err, "'grpo'") && strstr(err, "gspo"), "%s", err);
    CHECK(al_trainer_config_set(&c, "lr_schedule", "linear", err, sizeof err) == -1);
    CHECKF(strstr(err, "lr_schedule"), "%s", err);
    CHECK(al_trainer_config_set(&c, "decay_1d", "yes", err, sizeof err) == -1);
    CHECK(al_trainer_config_set(&c, "temperature", "inf", err, sizeof err) == -1);
    /* Nothing above changed the defaults. */
    al_trainer_config d;
    al_trainer_config_default(&d);
    CHECK(memcmp(&c, &d, sizeof c) == 0);
}

TEST(json_config_file)
{
    al_trainer_config c;
    al_trainer_config_default(&c);
    char err[512];
    const char *j = "{\"loss\": \"gspo\", \"loss_agg\": \"seq-mean-token-mean\", \"eps_low\": 3e-4,"
                    " \"eps_high\": 4e-4, \"ppo_epochs\": 2, \"decay_1d\": false, \"lr\": 1e-6,"
                    " \"total_steps\": 1e3}";
    REQUIREF(al_trainer_config_from_json(&c, j, strlen(j), 0, err, sizeof err) == 0, "%s", err);
    CHECK(c.loss.kind == AL_LOSS_GSPO && c.loss.agg == AL_LOSS_AGG_SEQ_MEAN_TOKEN_MEAN);
    CHECK(c.loss.eps_low == 3e-4f && c.loss.eps_high == 4e-4f && c.ppo_epochs == 2);
    CHECK(c.optim.lr == 1e-6f && c.optim.total_steps == 1000 && c.decay_1d == 0);

    const char *other = "{\"bootstrap\": \"127.0.0.1:9092\", \"topics\": [1], \"kl_beta\": 0.1}";
    CHECK(al_trainer_config_from_json(&c, other, strlen(other), 0, err, sizeof err) == -1);
    CHECKF(strstr(err, "bootstrap"), "%s", err);
    al_trainer_config_default(&c);
    REQUIREF(al_trainer_config_from_json(&c, other, strlen(other), 1, err, sizeof err) == 0, "%s", err);
    CHECK(c.loss.kl_beta == 0.1f);
    const char *bad = "{\"kl\": \"k9\"}";
    CHECK(al_trainer_config_from_json(&c, bad, strlen(bad), 1, err, sizeof err) == -1);
    CHECKF(strstr(err, "k9"), "%s", err);
    CHECK(al_trainer_config_from_json(&c, "[1]", 3, 0, err, sizeof err) == -1);
    CHECKF(strstr(err, "object"), "%s", err);
    CHECK(al_trainer_config_from_json(&c, "{\"lr\": ", 7, 0, err, sizeof err) == -1);
}
