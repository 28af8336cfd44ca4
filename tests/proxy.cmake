# The capture proxy (stages/proxy): tests 1000-1099. The end-to-end tests run the arclight
# binary (`arclight proxy` and the embedded broker) against tests/fake_upstream.c, a
# vLLM-like upstream in the test process, over real sockets.
arclight_test(t1001_proxy SOURCES tests/t1001_proxy.c tests/fake_upstream.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL PkgConfig::LIBEVENT
  TIMEOUT 180)
add_dependencies(t1001_proxy arclight)
arclight_test(t1000_proxy_parsers SOURCES tests/t1000_proxy_parsers.c stages/proxy/http1.c TIMEOUT 30)

# libFuzzer target for the HTTP head parser and the JSON editor (tests/fuzz/proxy_corpus).
find_program(AL_PROXY_CLANG NAMES clang-14 clang)
if((ARCLIGHT_SANITIZE OR ARCLIGHT_FUZZ) AND AL_PROXY_CLANG)
  add_custom_command(
    OUTPUT ${PROJECT_BINARY_DIR}/fuzz_proxy_http1
    COMMAND ${AL_PROXY_CLANG} -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined
            ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_proxy_http1.c ${PROJECT_SOURCE_DIR}/stages/proxy/http1.c
            -o ${PROJECT_BINARY_DIR}/fuzz_proxy_http1 -ljansson
    DEPENDS ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_proxy_http1.c ${PROJECT_SOURCE_DIR}/stages/proxy/http1.c
            ${PROJECT_SOURCE_DIR}/stages/proxy/http1.h
    COMMENT "Building the fuzz target fuzz_proxy_http1 with ${AL_PROXY_CLANG}")
  add_custom_target(fuzz_proxy_http1_target ALL DEPENDS ${PROJECT_BINARY_DIR}/fuzz_proxy_http1)
  add_test(NAME t1004_proxy_fuzz
    COMMAND sh -c "rm -rf fuzz-proxy-scratch && mkdir -p fuzz-proxy-scratch && ./fuzz_proxy_http1 -seed=1 -runs=100000 -max_len=2048 -timeout=10 fuzz-proxy-scratch ${PROJECT_SOURCE_DIR}/tests/fuzz/proxy_corpus"
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(t1004_proxy_fuzz PROPERTIES TIMEOUT 120)
endif()
arclight_test(t1002_proxy_faults SOURCES tests/t1002_proxy_faults.c tests/fake_upstream.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL PkgConfig::LIBEVENT
  TIMEOUT 240)
add_dependencies(t1002_proxy_faults arclight)
arclight_test(t1003_proxy_node_agent SOURCES tests/t1003_proxy_node_agent.c tests/fake_upstream.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL PkgConfig::LIBEVENT
  TIMEOUT 120)
add_dependencies(t1003_proxy_node_agent arclight)

# The spool checksums records with zlib's crc32 (tools.cmake links zlib into arclight too).
find_package(ZLIB REQUIRED)
target_link_libraries(arclight PRIVATE ZLIB::ZLIB)
# The proxy's own HTTP/1.1 upstream client against a scripted server (stages/proxy/upstream.c).
arclight_test(t1005_proxy_upstream SOURCES tests/t1005_proxy_upstream.c stages/proxy/upstream.c
  LIBS PkgConfig::LIBEVENT TIMEOUT 60)
