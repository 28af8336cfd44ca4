# tools: arclight tail / record / replay against a real embedded broker (tests/broker_fixture.h).
# They run the arclight binary, so it is built first.
arclight_test(t0300_tail SOURCES tests/t0300_tail.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON TIMEOUT 180)
add_dependencies(t0300_tail arclight)
arclight_test(t0301_record_replay SOURCES tests/t0301_record_replay.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::AVRO TIMEOUT 180)
add_dependencies(t0301_record_replay arclight)
