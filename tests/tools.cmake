# tools: arclight tail / record / replay against a real embedded broker (tests/broker_fixture.h).
# They run the arclight binary, so it is built first.

arclight_test(t0300_tail SOURCES tests/t0300_tail.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON TIMEOUT 180)
add_dependencies(t0300_tail arclight)
arclight_test(t0301_record_replay SOURCES tests/t0301_record_replay.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::AVRO TIMEOUT 180)
add_dependencies(t0301_record_replay arclight)
arclight_test(t0302_recording_reader SOURCES tests/t0302_recording_reader.c tools/recording_reader.c
  LIBS arclight_avro PkgConfig::AVRO PkgConfig::JANSSON ZLIB::ZLIB TIMEOUT 120)
target_include_directories(t0302_recording_reader PRIVATE ${PROJECT_SOURCE_DIR}/tools)

# libFuzzer target for replay's recording reader, built with clang like tests/avro.cmake's
# (which sets AL_CLANG and generates AL_SCHEMAS_C, the embedded schemas the reader checks
# against), in the sanitizer build or with -DARCLIGHT_FUZZ=ON.
if((ARCLIGHT_SANITIZE OR ARCLIGHT_FUZZ) AND AL_CLANG AND AL_SCHEMAS_C)
  file(GLOB AL_RECORDING_FUZZ_AVRO CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/lib/avro/*.c)
  set(AL_RECORDING_FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_recording.c
      ${PROJECT_SOURCE_DIR}/tools/recording_reader.c ${AL_RECORDING_FUZZ_AVRO}
      ${PROJECT_SOURCE_DIR}/lib/core/util.c ${AL_SCHEMAS_C})
  add_custom_command(
    OUTPUT ${PROJECT_BINARY_DIR}/fuzz_recording
    COMMAND ${AL_CLANG} -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined
            -fno-sanitize-recover=undefined -I${PROJECT_SOURCE_DIR}/lib
            -I${PROJECT_SOURCE_DIR}/tools ${AL_RECORDING_FUZZ_SOURCES}
            -o ${PROJECT_BINARY_DIR}/fuzz_recording -ljansson -lcrypto -lz -lpthread -lm
    DEPENDS ${AL_RECORDING_FUZZ_SOURCES} ${PROJECT_SOURCE_DIR}/tools/recording_reader.h
    COMMENT "Building the fuzz target fuzz_recording with ${AL_CLANG}")
  add_custom_target(fuzz_recording_target ALL DEPENDS ${PROJECT_BINARY_DIR}/fuzz_recording)
  # New inputs go to the scratch directory; the committed corpus stays as it is.
  add_test(NAME t0303_recording_fuzz
    COMMAND sh -c "rm -rf fuzz-recording-scratch && mkdir -p fuzz-recording-scratch && ./fuzz_recording -seed=1 -runs=30000 -max_len=8192 -timeout=10 fuzz-recording-scratch ${PROJECT_SOURCE_DIR}/tests/fuzz/recording_corpus"
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(t0303_recording_fuzz PROPERTIES TIMEOUT 180)
endif()
