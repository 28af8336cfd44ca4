# `arclight sync` (stages/sync): tests 1250-1269. Two `arclight serve --weight-routes` replicas,
# one driven with SGLang's routes and one with vLLM's, and the embedded broker.
arclight_test(t1250_sync SOURCES tests/t1250_sync.c
  LIBS arclight_model arclight_avro arclight_core PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL
  TIMEOUT 180)
add_dependencies(t1250_sync arclight)
