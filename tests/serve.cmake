# The policy server (stages/serve): tests 1101-1199. They run the arclight binary
# (`arclight serve`, the embedded broker) over real sockets, with the tiny model.
arclight_test(t1101_serve SOURCES tests/t1101_serve.c
  LIBS arclight_model PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 120)
add_dependencies(t1101_serve arclight)
arclight_test(t1102_serve_swap SOURCES tests/t1102_serve_swap.c
  LIBS arclight_model arclight_avro arclight_core PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL
  TIMEOUT 120)
add_dependencies(t1102_serve_swap arclight)
# (a few seconds; about a minute under ASan when the fixture model is stale and gets re-tuned)
arclight_test(t1103_serve_openai_node SOURCES tests/t1103_serve_openai_node.c
  LIBS arclight_model PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 240)
add_dependencies(t1103_serve_openai_node arclight)
arclight_test(t1104_serve_proxy SOURCES tests/t1104_serve_proxy.c
  LIBS arclight_model arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 120)
add_dependencies(t1104_serve_proxy arclight)

# libFuzzer target for the request parser (stages/serve/request.c), in the sanitizer build or
# with -DARCLIGHT_FUZZ=ON, like the other fuzz targets; t1105 runs it from its seed corpus.
find_program(AL_SERVE_CLANG NAMES clang-14 clang)
if((ARCLIGHT_SANITIZE OR ARCLIGHT_FUZZ) AND AL_SERVE_CLANG)
  set(AL_SERVE_FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_serve_request.c
      ${PROJECT_SOURCE_DIR}/stages/serve/request.c ${PROJECT_SOURCE_DIR}/lib/model/infer.c
      ${PROJECT_SOURCE_DIR}/lib/model/tokenizer.c ${PROJECT_SOURCE_DIR}/lib/model/tokenizer_chat.c
      ${PROJECT_SOURCE_DIR}/lib/model/unicode.c ${PROJECT_SOURCE_DIR}/lib/model/unicode_tables.c
      ${PROJECT_SOURCE_DIR}/lib/model/json.c ${PROJECT_SOURCE_DIR}/lib/model/model.c
      ${PROJECT_SOURCE_DIR}/lib/model/config.c ${PROJECT_SOURCE_DIR}/lib/model/layers.c
      ${PROJECT_SOURCE_DIR}/lib/model/gemm.c ${PROJECT_SOURCE_DIR}/lib/model/safetensors.c)
  add_custom_command(
    OUTPUT ${PROJECT_BINARY_DIR}/fuzz_serve_request
    COMMAND ${AL_SERVE_CLANG} -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined
            -fno-sanitize-recover=undefined -I${PROJECT_SOURCE_DIR}/lib
            -I${PROJECT_SOURCE_DIR}/stages/serve ${AL_SERVE_FUZZ_SOURCES}
            -o ${PROJECT_BINARY_DIR}/fuzz_serve_request -ljansson -lpthread -lm
    DEPENDS ${AL_SERVE_FUZZ_SOURCES} ${PROJECT_SOURCE_DIR}/stages/serve/request.h
            ${PROJECT_SOURCE_DIR}/lib/model/tokenizer.h ${PROJECT_SOURCE_DIR}/lib/model/infer.h
    COMMENT "Building the fuzz target fuzz_serve_request with ${AL_SERVE_CLANG}")
  add_custom_target(fuzz_serve_request_target ALL DEPENDS ${PROJECT_BINARY_DIR}/fuzz_serve_request)
  add_test(NAME t1105_serve_request_fuzz
    COMMAND sh -c "rm -rf fuzz-serve-scratch && mkdir -p fuzz-serve-scratch && ./fuzz_serve_request -seed=1 -runs=50000 -max_len=2048 -timeout=10 fuzz-serve-scratch ${PROJECT_SOURCE_DIR}/tests/fuzz/serve_corpus"
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(t1105_serve_request_fuzz PROPERTIES TIMEOUT 120
    ENVIRONMENT "ARCLIGHT_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endif()
