# The JSON reader the model files are read with (lib/text/json.c), test 0500; the ranges of
# lib/model's tests: model.cmake.
arclight_test(t0500_model_json SOURCES tests/t0500_model_json.c LIBS arclight_model)
