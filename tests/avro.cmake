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

# The libFuzzer target for every decoder that faces Kafka bytes (arclight_fuzz: CMakeLists.txt).
# AL_AVRO_FUZZ_SOURCES: the codecs with their embedded schemas, for every fuzz target that
# decodes or encodes messages (link with -ljansson -lcrypto).
file(GLOB AL_AVRO_FUZZ_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/lib/avro/*.c)
list(APPEND AL_AVRO_FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/lib/core/buf.c ${PROJECT_SOURCE_DIR}/lib/core/util.c ${PROJECT_SOURCE_DIR}/lib/core/sha256.c
  ${AL_SCHEMAS_C})
arclight_fuzz(fuzz_decode TEST t0105_avro_fuzz CORPUS corpus RUNS 50000 MAX_LEN 4096
  SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_decode.c ${AL_AVRO_FUZZ_SOURCES}
  DEPENDS ${PROJECT_SOURCE_DIR}/lib/avro/codec.h ${PROJECT_SOURCE_DIR}/lib/avro/binary.h
          ${PROJECT_SOURCE_DIR}/lib/avro/tree.h
  LIBS -ljansson -lcrypto)
