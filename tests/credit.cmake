# Credit assignment (stages/credit): tests 0800-0849. The pure logic is a library of its own
# so that unit tests call it directly; the Kafka tests run `arclight credit` against the
# embedded broker over TCP.
add_library(arclight_credit STATIC stages/credit/credit.c)
target_include_directories(arclight_credit PUBLIC ${PROJECT_SOURCE_DIR}/stages/credit ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(arclight_credit PUBLIC arclight_avro arclight_core m)

arclight_test(t0800_credit_logic SOURCES tests/t0800_credit_logic.c LIBS arclight_credit TIMEOUT 180)
arclight_test(t0801_credit_kafka SOURCES tests/t0801_credit_kafka.c
  LIBS arclight_avro PkgConfig::RDKAFKA TIMEOUT 240 KAFKA)
add_dependencies(t0801_credit_kafka arclight)

# libFuzzer target for the logic fed spans with any values a producer could write
# (tests/fuzz/fuzz_credit.c; arclight_fuzz: CMakeLists.txt).
arclight_fuzz(fuzz_credit TEST t0802_credit_fuzz CORPUS credit_corpus RUNS 50000 MAX_LEN 2048
  SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_credit.c ${PROJECT_SOURCE_DIR}/stages/credit/credit.c ${PROJECT_SOURCE_DIR}/lib/core/map.c
          ${AL_AVRO_FUZZ_SOURCES}
  DEPENDS ${PROJECT_SOURCE_DIR}/stages/credit/credit.h ${PROJECT_SOURCE_DIR}/lib/avro/codec.h
  INCLUDES ${PROJECT_SOURCE_DIR}/stages/credit
  LIBS -ljansson -lcrypto)

# The contracts of credit's numbers, each expected value worked out from the documentation.
arclight_test(t0803_credit_rewards SOURCES tests/t0803_credit_rewards.c LIBS arclight_credit TIMEOUT 60)
arclight_test(t0804_credit_positions SOURCES tests/t0804_credit_positions.c LIBS arclight_credit TIMEOUT 60)
arclight_test(t0805_credit_options SOURCES tests/t0805_credit_options.c LIBS arclight_credit TIMEOUT 60)
add_dependencies(t0805_credit_options arclight)

# What credit does with the rollout controller's eval spans and retried attempts.
# --credit step (group-in-group credit from a final reward): hand-worked values.
arclight_test(t0807_credit_step SOURCES tests/t0807_credit_step.c LIBS arclight_credit TIMEOUT 60)
# The same on recorded spans of a letters run (tests/credit/), replayed twice byte for byte
# and checked against tests/t0808_credit_step_reference.py, written from the definition.
arclight_test(t0808_credit_step_reference SOURCES tests/t0808_credit_step_reference.c
  tools/recording_reader.c LIBS arclight_credit PkgConfig::JANSSON ZLIB::ZLIB TIMEOUT 60)
target_include_directories(t0808_credit_step_reference PRIVATE ${PROJECT_SOURCE_DIR}/tools)

arclight_test(t0806_credit_eval_retry SOURCES tests/t0806_credit_eval_retry.c LIBS arclight_credit TIMEOUT 60)
