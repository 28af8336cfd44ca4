arclight_test(t0001_core SOURCES tests/t0001_core.c LIBS arclight_core)
