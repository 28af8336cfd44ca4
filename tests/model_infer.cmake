# The inference path of lib/model (lib/model/infer.c: sampling, raw logprobs), tests 1100-1109.
# Links arclight_model only, so it runs in model-only builds too.
arclight_test(t1100_model_infer SOURCES tests/t1100_model_infer.c LIBS arclight_model TIMEOUT 60)
