# Credit assignment (stages/credit): tests 0800-0849. The pure logic is a library of its own
# so that unit tests call it directly; the Kafka tests run `arclight credit` against the
# embedded broker over TCP.
add_library(arclight_credit STATIC stages/credit/credit.c)
target_include_directories(arclight_credit PUBLIC ${PROJECT_SOURCE_DIR}/stages/credit ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(arclight_credit PUBLIC arclight_avro arclight_core m)

arclight_test(t0800_credit_logic SOURCES tests/t0800_credit_logic.c LIBS arclight_credit TIMEOUT 60)
arclight_test(t0801_credit_kafka SOURCES tests/t0801_credit_kafka.c
  LIBS arclight_avro PkgConfig::RDKAFKA TIMEOUT 240)
add_dependencies(t0801_credit_kafka arclight)

# libFuzzer target for the logic fed spans with any values a producer could write
# (tests/fuzz/fuzz_credit.c), built with clang in the sanitizer build like the others.
find_program(AL_CREDIT_CLANG NAMES clang-14 clang)
if((ARCLIGHT_SANITIZE OR ARCLIGHT_FUZZ) AND AL_CREDIT_CLANG)
  file(GLOB AL_CREDIT_FUZZ_AVRO CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/lib/avro/*.c)
  set(AL_CREDIT_FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_credit.c
      ${PROJECT_SOURCE_DIR}/stages/credit/credit.c ${AL_CREDIT_FUZZ_AVRO}
      ${PROJECT_SOURCE_DIR}/lib/core/util.c ${AL_SCHEMAS_C})
  add_custom_command(
    OUTPUT ${PROJECT_BINARY_DIR}/fuzz_credit
    COMMAND ${AL_CREDIT_CLANG} -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined
            -fno-sanitize-recover=undefined -I${PROJECT_SOURCE_DIR}/lib
            -I${PROJECT_SOURCE_DIR}/stages/credit ${AL_CREDIT_FUZZ_SOURCES}
            -o ${PROJECT_BINARY_DIR}/fuzz_credit -ljansson -lcrypto -lpthread -lm
    DEPENDS ${AL_CREDIT_FUZZ_SOURCES} ${PROJECT_SOURCE_DIR}/stages/credit/credit.h
            ${PROJECT_SOURCE_DIR}/lib/avro/codec.h ${PROJECT_SOURCE_DIR}/lib/avro/binary.h
    COMMENT "Building the fuzz target fuzz_credit with ${AL_CREDIT_CLANG}")
  add_custom_target(fuzz_credit_target ALL DEPENDS ${PROJECT_BINARY_DIR}/fuzz_credit)
  add_test(NAME t0802_credit_fuzz
    COMMAND sh -c "rm -rf fuzz-credit-scratch && mkdir -p fuzz-credit-scratch && ./fuzz_credit -seed=1 -runs=50000 -max_len=2048 -timeout=10 fuzz-credit-scratch ${PROJECT_SOURCE_DIR}/tests/fuzz/credit_corpus"
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(t0802_credit_fuzz PROPERTIES TIMEOUT 120)
endif()
