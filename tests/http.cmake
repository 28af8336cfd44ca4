# lib/http: the metrics registry and the /metrics + /healthz server (over real sockets).
arclight_test(t0400_metrics SOURCES tests/t0400_metrics.c LIBS arclight_http TIMEOUT 60)
arclight_test(t0401_metrics_server SOURCES tests/t0401_metrics_server.c
  LIBS arclight_http PkgConfig::CURL PkgConfig::JANSSON TIMEOUT 60)
