arclight_test(t0001_core SOURCES tests/t0001_core.c LIBS arclight_core)
arclight_test(t0002_setup SOURCES tests/t0002_setup.c TIMEOUT 600)
arclight_test(t0003_compose SOURCES tests/t0003_compose.c)
