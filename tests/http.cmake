# lib/http: the metrics registry and the /metrics + /healthz server (over real sockets).
arclight_test(t0400_metrics SOURCES tests/t0400_metrics.c LIBS arclight_http TIMEOUT 60)
arclight_test(t0401_metrics_server SOURCES tests/t0401_metrics_server.c
  LIBS arclight_http PkgConfig::CURL PkgConfig::JANSSON TIMEOUT 60)
# libFuzzer target for the one HTTP/1.1 request parser (lib/http/http1.c): heads under any
# limits, chunked bodies whole and in pieces.
arclight_fuzz(fuzz_http_parser TEST t0402_http_parser_fuzz CORPUS http_corpus RUNS 200000
  MAX_LEN 2048
  SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_http_parser.c ${PROJECT_SOURCE_DIR}/lib/http/http1.c
  DEPENDS ${PROJECT_SOURCE_DIR}/lib/http/http1.h ${PROJECT_SOURCE_DIR}/lib/core/slice.h)
