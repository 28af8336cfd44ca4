# Loss, optimizer, trainer and checkpoint tests of the model library (tests 0650-0699).
# They link arclight_model only, so they build in model-only mode too.
arclight_test(t0650_loss_vs_pytorch SOURCES tests/t0650_loss_vs_pytorch.c LIBS arclight_model TIMEOUT 60)
arclight_test(t0651_loss_cases SOURCES tests/t0651_loss_cases.c LIBS arclight_model TIMEOUT 60)
arclight_test(t0652_trainer SOURCES tests/t0652_trainer.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0653_trainer_vs_pytorch SOURCES tests/t0653_trainer_vs_pytorch.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0654_trainer_config SOURCES tests/t0654_trainer_config.c LIBS arclight_model TIMEOUT 30)
