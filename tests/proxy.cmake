# The capture proxy (stages/proxy): tests 1000-1099. The end-to-end tests run the arclight
# binary (`arclight proxy` and the embedded broker) against tests/fake_upstream.c, a
# vLLM-like upstream in the test process, over real sockets.
arclight_test(t1001_proxy SOURCES tests/t1001_proxy.c tests/fake_upstream.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL PkgConfig::LIBEVENT
  TIMEOUT 180 KAFKA)
add_dependencies(t1001_proxy arclight)
arclight_test(t1000_proxy_parsers SOURCES tests/t1000_proxy_parsers.c lib/http/http1.c stages/proxy/json_edit.c TIMEOUT 30)

# libFuzzer target for the HTTP head parser and the JSON editor (arclight_fuzz: CMakeLists.txt).
arclight_fuzz(fuzz_proxy_http1 TEST t1004_proxy_fuzz CORPUS proxy_corpus RUNS 100000 MAX_LEN 2048
  SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_proxy_http1.c ${PROJECT_SOURCE_DIR}/lib/http/http1.c
    ${PROJECT_SOURCE_DIR}/stages/proxy/json_edit.c
  DEPENDS ${PROJECT_SOURCE_DIR}/stages/proxy/json_edit.h
    ${PROJECT_SOURCE_DIR}/stages/proxy/slice.h ${PROJECT_SOURCE_DIR}/lib/http/http1.h
  LIBS -ljansson)
arclight_test(t1002_proxy_faults SOURCES tests/t1002_proxy_faults.c tests/fake_upstream.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL PkgConfig::LIBEVENT
  TIMEOUT 240 KAFKA)
add_dependencies(t1002_proxy_faults arclight)
arclight_test(t1003_proxy_node_agent SOURCES tests/t1003_proxy_node_agent.c tests/fake_upstream.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL PkgConfig::LIBEVENT
  TIMEOUT 120 KAFKA)
add_dependencies(t1003_proxy_node_agent arclight)

# The spool checksums records with zlib's crc32 (tools.cmake links zlib into arclight too).
find_package(ZLIB REQUIRED)
target_link_libraries(arclight PRIVATE ZLIB::ZLIB)
# The proxy's own HTTP/1.1 upstream client against a scripted server (stages/proxy/upstream.c).
arclight_test(t1005_proxy_upstream SOURCES tests/t1005_proxy_upstream.c stages/proxy/upstream.c
  LIBS PkgConfig::LIBEVENT TIMEOUT 60)
# Held-out evaluation routes (/e/, /e:T/, X-Arclight-Eval): greedy sampling and eval spans.
arclight_test(t1006_proxy_eval SOURCES tests/t1006_proxy_eval.c tests/fake_upstream.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL PkgConfig::LIBEVENT
  TIMEOUT 180)
add_dependencies(t1006_proxy_eval arclight)
# The Responses API and Anthropic Messages translators against fixtures from their docs.
arclight_test(t1007_proxy_translate SOURCES tests/t1007_proxy_translate.c
  LIBS arclight_api TIMEOUT 30)
# The Responses and Messages APIs end to end through arclight proxy to the fake upstream.
arclight_test(t1008_proxy_apis SOURCES tests/t1008_proxy_apis.c tests/fake_upstream.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL PkgConfig::LIBEVENT
  TIMEOUT 180)
add_dependencies(t1008_proxy_apis arclight)
# The Responses API passed through (--upstream-native) to arclight serve, which serves it
# with token ids in vLLM's shape: what the agent gets, what the span holds.
arclight_test(t1011_proxy_native SOURCES tests/t1011_proxy_native.c tests/fake_upstream.c
  LIBS arclight_model arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL
  PkgConfig::LIBEVENT TIMEOUT 180)
add_dependencies(t1011_proxy_native arclight)
# The proxy in front of a fleet of `arclight serve` replicas: versions from arclight.sync,
# --max-staleness, health checks and failover (stages/proxy/fleet.c).
arclight_test(t1013_proxy_fleet SOURCES tests/t1013_proxy_fleet.c tests/fake_upstream.c
  LIBS arclight_model arclight_avro arclight_core PkgConfig::RDKAFKA PkgConfig::JANSSON
  PkgConfig::CURL PkgConfig::LIBEVENT TIMEOUT 180)
add_dependencies(t1013_proxy_fleet arclight)
# Real agent harnesses through the proxy (tests/node/package.json pins them): the OpenAI
# Agents SDK, the Codex CLI and Claude Code, against the fake upstream and arclight serve.
arclight_test(t1009_proxy_clients SOURCES tests/t1009_proxy_clients.c tests/fake_upstream.c
  LIBS arclight_model arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL
  PkgConfig::LIBEVENT TIMEOUT 900)
add_dependencies(t1009_proxy_clients arclight)
if(ARCLIGHT_SANITIZE)
  # Unoptimised, sanitized, serve prefills a harness's 10k-token prompt in minutes: in the
  # sanitizer build the model server runs from the release build (scripts/test.sh builds it
  # first; the test falls back to this build's binary without one). The proxy under test
  # stays this build's.
  set_property(TEST t1009_proxy_clients APPEND PROPERTY ENVIRONMENT
    "ARCLIGHT_SERVE_BIN=${PROJECT_SOURCE_DIR}/build/arclight")
endif()
# libFuzzer target for the API translators: requests, whole answers and streams.
arclight_fuzz(fuzz_proxy_translate TEST t1010_proxy_translate_fuzz CORPUS translate_corpus
  RUNS 10000 MAX_LEN 4096
  SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_proxy_translate.c
    ${PROJECT_SOURCE_DIR}/lib/api/translate.c ${PROJECT_SOURCE_DIR}/lib/api/responses.c
    ${PROJECT_SOURCE_DIR}/lib/api/messages.c
    ${PROJECT_SOURCE_DIR}/lib/api/common.c ${PROJECT_SOURCE_DIR}/lib/core/buf.c
  DEPENDS ${PROJECT_SOURCE_DIR}/lib/api/translate.h
    ${PROJECT_SOURCE_DIR}/lib/api/translate_int.h
  LIBS -ljansson)
# libFuzzer target for what the proxy reads off a natively served answer (native.c).
arclight_fuzz(fuzz_proxy_native TEST t1012_proxy_native_fuzz CORPUS native_corpus
  RUNS 10000 MAX_LEN 8192
  SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_proxy_native.c
    ${PROJECT_SOURCE_DIR}/stages/proxy/native.c ${PROJECT_SOURCE_DIR}/lib/core/log.c
    ${PROJECT_SOURCE_DIR}/lib/core/util.c ${PROJECT_SOURCE_DIR}/lib/core/buf.c
  INCLUDES ${PROJECT_SOURCE_DIR}/stages/proxy ${PROJECT_SOURCE_DIR}/lib/http
  DEPENDS ${PROJECT_SOURCE_DIR}/stages/proxy/proxy.h
  LIBS -ljansson)
