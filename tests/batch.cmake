# Batching stage: tests 0900-0949. The logic (stages/batch/batcher.c, no Kafka) is built into
# its own library for the unit tests; the stage tests drive the `arclight batch` binary
# against the embedded broker over TCP.
add_library(arclight_batch STATIC ${PROJECT_SOURCE_DIR}/stages/batch/batcher.c)
target_include_directories(arclight_batch PUBLIC ${PROJECT_SOURCE_DIR}/lib ${PROJECT_SOURCE_DIR}/stages)
target_link_libraries(arclight_batch PUBLIC arclight_avro arclight_core m)
arclight_test(t0900_batch_logic SOURCES tests/t0900_batch_logic.c LIBS arclight_batch TIMEOUT 60)
arclight_test(t0901_batch_stage SOURCES tests/t0901_batch_stage.c LIBS arclight_kafka arclight_avro TIMEOUT 240)

# libFuzzer target for the logic fed transitions with any values a producer could write
# (tests/fuzz/fuzz_batch.c), built with clang in the sanitizer build like the others.
find_program(AL_BATCH_CLANG NAMES clang-14 clang)
if((ARCLIGHT_SANITIZE OR ARCLIGHT_FUZZ) AND AL_BATCH_CLANG)
  file(GLOB AL_BATCH_FUZZ_AVRO CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/lib/avro/*.c)
  set(AL_BATCH_FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_batch.c
      ${PROJECT_SOURCE_DIR}/stages/batch/batcher.c ${AL_BATCH_FUZZ_AVRO}
      ${PROJECT_SOURCE_DIR}/lib/core/util.c ${AL_SCHEMAS_C})
  add_custom_command(
    OUTPUT ${PROJECT_BINARY_DIR}/fuzz_batch
    COMMAND ${AL_BATCH_CLANG} -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined
            -fno-sanitize-recover=undefined -I${PROJECT_SOURCE_DIR}/lib
            -I${PROJECT_SOURCE_DIR}/stages ${AL_BATCH_FUZZ_SOURCES}
            -o ${PROJECT_BINARY_DIR}/fuzz_batch -ljansson -lcrypto -lpthread -lm
    DEPENDS ${AL_BATCH_FUZZ_SOURCES} ${PROJECT_SOURCE_DIR}/stages/batch/batcher.h
            ${PROJECT_SOURCE_DIR}/lib/avro/codec.h ${PROJECT_SOURCE_DIR}/lib/avro/binary.h
    COMMENT "Building the fuzz target fuzz_batch with ${AL_BATCH_CLANG}")
  add_custom_target(fuzz_batch_target ALL DEPENDS ${PROJECT_BINARY_DIR}/fuzz_batch)
  add_test(NAME t0902_batch_fuzz
    COMMAND sh -c "rm -rf fuzz-batch-scratch && mkdir -p fuzz-batch-scratch && ./fuzz_batch -seed=1 -runs=8000 -max_len=4096 -timeout=10 fuzz-batch-scratch ${PROJECT_SOURCE_DIR}/tests/fuzz/batch_corpus"
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(t0902_batch_fuzz PROPERTIES TIMEOUT 120)
endif()
