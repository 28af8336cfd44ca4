arclight_test(t0500_model_json SOURCES tests/t0500_model_json.c LIBS arclight_model)
