# Loss, optimizer, trainer and checkpoint tests of the model library (tests 0650-0699).
# They link arclight_model only, so they build in model-only mode too.
arclight_test(t0650_loss_vs_pytorch SOURCES tests/t0650_loss_vs_pytorch.c LIBS arclight_model TIMEOUT 60)
arclight_test(t0651_loss_cases SOURCES tests/t0651_loss_cases.c LIBS arclight_model TIMEOUT 60)
arclight_test(t0652_trainer SOURCES tests/t0652_trainer.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0653_trainer_vs_pytorch SOURCES tests/t0653_trainer_vs_pytorch.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0654_trainer_config SOURCES tests/t0654_trainer_config.c LIBS arclight_model TIMEOUT 30)

# The trainer's optimizer.safetensors read the way docs/TRAINING.md describes it, by a
# Python reader checked against torch.optim.AdamW (issue 18: the doc must not go stale).
# Numbered in credit's range (08xx) when it was written; docs/TRAINING.md names t0810,
# so it keeps its number.
arclight_test(t0810_optimizer_layout SOURCES tests/t0810_optimizer_layout.c LIBS arclight_model TIMEOUT 180)
