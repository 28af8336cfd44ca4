# tools: arclight tail / record / replay against a real embedded broker (tests/broker_fixture.h).
# They run the arclight binary, so it is built first.

arclight_test(t0300_tail SOURCES tests/t0300_tail.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON TIMEOUT 180 KAFKA)
add_dependencies(t0300_tail arclight)
arclight_test(t0301_record_replay SOURCES tests/t0301_record_replay.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::AVRO TIMEOUT 180 KAFKA)
add_dependencies(t0301_record_replay arclight)
arclight_test(t0302_recording_reader SOURCES tests/t0302_recording_reader.c tools/recording_reader.c
  LIBS arclight_avro PkgConfig::AVRO PkgConfig::JANSSON ZLIB::ZLIB TIMEOUT 120)
target_include_directories(t0302_recording_reader PRIVATE ${PROJECT_SOURCE_DIR}/tools)

# libFuzzer target for replay's recording reader (arclight_fuzz: CMakeLists.txt), with the
# embedded schemas the reader checks against (AL_SCHEMAS_C, from tests/avro.cmake).
arclight_fuzz(fuzz_recording TEST t0303_recording_fuzz CORPUS recording_corpus RUNS 30000
  MAX_LEN 8192
  SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_recording.c ${PROJECT_SOURCE_DIR}/tools/recording_reader.c
          ${AL_AVRO_FUZZ_SOURCES}
  DEPENDS ${PROJECT_SOURCE_DIR}/tools/recording_reader.h
  INCLUDES ${PROJECT_SOURCE_DIR}/tools
  LIBS -ljansson -lcrypto -lz)
