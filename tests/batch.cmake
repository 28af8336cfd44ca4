# Batching stage: tests 0900-0949. The logic (stages/batch/batcher.c, no Kafka) is built into
# its own library for the unit tests; the stage tests drive the `arclight batch` binary
# against the embedded broker over TCP.
add_library(arclight_batch STATIC ${PROJECT_SOURCE_DIR}/stages/batch/batcher.c)
target_include_directories(arclight_batch PUBLIC ${PROJECT_SOURCE_DIR}/lib ${PROJECT_SOURCE_DIR}/stages)
target_link_libraries(arclight_batch PUBLIC arclight_avro arclight_core m)
arclight_test(t0900_batch_logic SOURCES tests/t0900_batch_logic.c LIBS arclight_batch TIMEOUT 60)
arclight_test(t0901_batch_stage SOURCES tests/t0901_batch_stage.c LIBS arclight_kafka arclight_avro TIMEOUT 240 KAFKA)

# libFuzzer target for the logic fed transitions with any values a producer could write
# (tests/fuzz/fuzz_batch.c; arclight_fuzz: CMakeLists.txt).
arclight_fuzz(fuzz_batch TEST t0902_batch_fuzz CORPUS batch_corpus RUNS 8000 MAX_LEN 4096
  SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_batch.c ${PROJECT_SOURCE_DIR}/stages/batch/batcher.c
          ${AL_AVRO_FUZZ_SOURCES}
  DEPENDS ${PROJECT_SOURCE_DIR}/stages/batch/batcher.h ${PROJECT_SOURCE_DIR}/lib/avro/codec.h
  INCLUDES ${PROJECT_SOURCE_DIR}/stages
  LIBS -ljansson -lcrypto)
