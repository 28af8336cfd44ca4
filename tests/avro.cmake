# lib/avro: the schemas are compiled into arclight_avro (generated C file), and the
# codec tests.
file(GLOB AL_SCHEMA_FILES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/schemas/*.avsc
     ${PROJECT_SOURCE_DIR}/schemas/history/*.avsc)
set(AL_SCHEMAS_C ${PROJECT_BINARY_DIR}/generated/al_schemas_embedded.c)
add_custom_command(
  OUTPUT ${AL_SCHEMAS_C}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/generated
  COMMAND ${CMAKE_COMMAND} -DSCHEMA_DIR=${PROJECT_SOURCE_DIR}/schemas -DOUT=${AL_SCHEMAS_C}
          -P ${PROJECT_SOURCE_DIR}/lib/avro/embed_schemas.cmake
  DEPENDS ${AL_SCHEMA_FILES} ${PROJECT_SOURCE_DIR}/lib/avro/embed_schemas.cmake
  COMMENT "Embedding schemas/*.avsc")
target_sources(arclight_avro PRIVATE ${AL_SCHEMAS_C})

arclight_test(t0100_avro_schema SOURCES tests/t0100_avro_schema.c
  LIBS arclight_avro PkgConfig::JANSSON TIMEOUT 60)
arclight_test(t0101_avro_roundtrip SOURCES tests/t0101_avro_roundtrip.c
  LIBS arclight_avro PkgConfig::AVRO PkgConfig::JANSSON TIMEOUT 60)
arclight_test(t0102_avro_untrusted SOURCES tests/t0102_avro_untrusted.c
  LIBS arclight_avro PkgConfig::JANSSON TIMEOUT 120)
arclight_test(t0103_avro_evolution SOURCES tests/t0103_avro_evolution.c
  LIBS arclight_avro PkgConfig::AVRO PkgConfig::JANSSON TIMEOUT 60)
arclight_test(t0104_avro_corpus SOURCES tests/t0104_avro_corpus.c
  LIBS arclight_avro TIMEOUT 60)

# The libFuzzer target is built with clang (the main compiler is gcc) from the same
# sources, in the sanitizer build (scripts/test.sh's build-asan) or with -DARCLIGHT_FUZZ=ON.
option(ARCLIGHT_FUZZ "Build the libFuzzer targets (clang) outside the sanitizer build" OFF)
find_program(AL_CLANG NAMES clang-14 clang)
if((ARCLIGHT_SANITIZE OR ARCLIGHT_FUZZ) AND AL_CLANG)
  file(GLOB AL_AVRO_FUZZ_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/lib/avro/*.c)
  set(AL_FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_decode.c ${AL_AVRO_FUZZ_SOURCES}
      ${PROJECT_SOURCE_DIR}/lib/core/util.c ${AL_SCHEMAS_C})
  add_custom_command(
    OUTPUT ${PROJECT_BINARY_DIR}/fuzz_decode
    COMMAND ${AL_CLANG} -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined
            -fno-sanitize-recover=undefined -I${PROJECT_SOURCE_DIR}/lib ${AL_FUZZ_SOURCES}
            -o ${PROJECT_BINARY_DIR}/fuzz_decode -ljansson -lcrypto -lpthread -lm
    DEPENDS ${AL_FUZZ_SOURCES} ${PROJECT_SOURCE_DIR}/lib/avro/codec.h
            ${PROJECT_SOURCE_DIR}/lib/avro/binary.h ${PROJECT_SOURCE_DIR}/lib/avro/tree.h
    COMMENT "Building the fuzz target fuzz_decode with ${AL_CLANG}")
  add_custom_target(fuzz_decode_target ALL DEPENDS ${PROJECT_BINARY_DIR}/fuzz_decode)
  # New inputs go to the first (scratch) directory; the committed corpus stays as it is.
  # Every fuzz test here runs with a fixed seed, so that CI replays the same inputs each
  # time: a crash found by chance must not stop a change from landing. Exploring is a
  # separate run without -seed (each target's header has the command); what it finds goes
  # into the corpus.
  add_test(NAME t0105_avro_fuzz
    COMMAND sh -c "rm -rf fuzz-scratch && mkdir -p fuzz-scratch && ./fuzz_decode -seed=1 -runs=50000 -max_len=4096 -timeout=10 fuzz-scratch ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus"
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(t0105_avro_fuzz PROPERTIES TIMEOUT 180)
elseif(ARCLIGHT_SANITIZE)
  message(STATUS "arclight: clang not found, fuzz target fuzz_decode skipped")
endif()
