# Batching stage: tests 0900-0949. The logic (stages/batch/batcher.c, no Kafka) is built into
# its own library for the unit tests; the stage tests drive the `arclight batch` binary
# against the embedded broker over TCP.
add_library(arclight_batch STATIC ${PROJECT_SOURCE_DIR}/stages/batch/batcher.c)
target_include_directories(arclight_batch PUBLIC ${PROJECT_SOURCE_DIR}/lib ${PROJECT_SOURCE_DIR}/stages)
target_link_libraries(arclight_batch PUBLIC arclight_avro arclight_core m)
arclight_test(t0900_batch_logic SOURCES tests/t0900_batch_logic.c LIBS arclight_batch TIMEOUT 60)
arclight_test(t0901_batch_stage SOURCES tests/t0901_batch_stage.c LIBS arclight_kafka arclight_avro TIMEOUT 240)
