# `arclight sync` (stages/sync): tests 1250-1269. Two `arclight serve --weight-routes` replicas,
# one driven with SGLang's routes and one with vLLM's, and the embedded broker.
arclight_test(t1250_sync SOURCES tests/t1250_sync.c
  LIBS arclight_model arclight_avro arclight_core PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL
  TIMEOUT 180)
add_dependencies(t1250_sync arclight)
# --stage-dir: versions with http:// URIs from the trainer's checkpoint server (linked in, as
# t1109 does) are copied whole, checked, and loaded from the copy.
arclight_test(t1251_sync_stage SOURCES tests/t1251_sync_stage.c stages/train/ckpt_http.c
  stages/sync/fetch.c
  LIBS arclight_http arclight_model arclight_avro arclight_core PkgConfig::RDKAFKA PkgConfig::JANSSON
       PkgConfig::CURL PkgConfig::LIBEVENT TIMEOUT 180)
add_dependencies(t1251_sync_stage arclight)
