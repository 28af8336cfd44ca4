# The policy server (stages/serve): tests 1101-1199. They run the arclight binary
# (`arclight serve`, the embedded broker) over real sockets, with the tiny model.
arclight_test(t1101_serve SOURCES tests/t1101_serve.c
  LIBS arclight_model PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 120)
add_dependencies(t1101_serve arclight)
arclight_test(t1102_serve_swap SOURCES tests/t1102_serve_swap.c
  LIBS arclight_model arclight_avro arclight_core PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL
  TIMEOUT 120 KAFKA)
add_dependencies(t1102_serve_swap arclight)
# (a few seconds; about a minute under ASan when the fixture model is stale and gets re-tuned)
arclight_test(t1103_serve_openai_node SOURCES tests/t1103_serve_openai_node.c
  LIBS arclight_model PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 240)
add_dependencies(t1103_serve_openai_node arclight)
arclight_test(t1104_serve_proxy SOURCES tests/t1104_serve_proxy.c
  LIBS arclight_model arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 120 KAFKA)
add_dependencies(t1104_serve_proxy arclight)

# libFuzzer target for the request parser (stages/serve/request.c; arclight_fuzz:
# CMakeLists.txt).
arclight_fuzz(fuzz_serve_request TEST t1105_serve_request_fuzz CORPUS serve_corpus RUNS 50000
  MAX_LEN 2048
  SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_serve_request.c ${PROJECT_SOURCE_DIR}/stages/serve/request.c
          ${PROJECT_SOURCE_DIR}/lib/api/common.c
          ${ARCLIGHT_MODEL_FUZZ_SOURCES}
  DEPENDS ${PROJECT_SOURCE_DIR}/stages/serve/request.h ${PROJECT_SOURCE_DIR}/lib/text/tokenizer.h
          ${PROJECT_SOURCE_DIR}/lib/model/infer.h
  INCLUDES ${PROJECT_SOURCE_DIR}/stages/serve
  LIBS -ljansson
  ENV ARCLIGHT_SOURCE_DIR=${PROJECT_SOURCE_DIR})
# What a PolicyVersion may make the follower do (issue 15, items 1-7 and 20); python3 runs a
# misbehaving checkpoint server (tests/serve/policy_http.py).
arclight_test(t1106_serve_policy SOURCES tests/t1106_serve_policy.c
  LIBS arclight_model arclight_avro arclight_core PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL
  TIMEOUT 300)
add_dependencies(t1106_serve_policy arclight)
# libFuzzer target for the follower's URI, path, sha256, redirect-origin and safetensors
# pre-checks (stages/serve/fetch.c).
arclight_fuzz(fuzz_serve_fetch TEST t1107_serve_fetch_fuzz CORPUS serve_fetch_corpus RUNS 100000
  MAX_LEN 512
  SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_serve_fetch.c ${PROJECT_SOURCE_DIR}/stages/serve/fetch.c
          ${PROJECT_SOURCE_DIR}/lib/core/util.c ${PROJECT_SOURCE_DIR}/lib/core/sha256.c ${PROJECT_SOURCE_DIR}/lib/core/buf.c
  DEPENDS ${PROJECT_SOURCE_DIR}/stages/serve/fetch.h
  INCLUDES ${PROJECT_SOURCE_DIR}/stages/serve
  LIBS -lcurl)
# serve's HTTP surface (issue 15): NUL round trip, the shared HTTP/1.1 parser's answers.
arclight_test(t1108_serve_http SOURCES tests/t1108_serve_http.c
  LIBS arclight_model PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 120)
add_dependencies(t1108_serve_http arclight)
# Every HTTP server of the project through the one parser (issue 15, items 15-17): serve, the
# --metrics server and the trainer's checkpoint server, probed with raw bytes.
arclight_test(t1109_http_servers SOURCES tests/t1109_http_servers.c stages/train/ckpt_http.c
  LIBS arclight_http arclight_model PkgConfig::JANSSON PkgConfig::CURL PkgConfig::LIBEVENT TIMEOUT 180)
add_dependencies(t1109_http_servers arclight)
# SGLang's and vLLM's weight-update routes (issue 23; stages/serve/weights_api.c): answers field
# by field as their servers give them, all-or-nothing loads, logprobs of the new weights.
arclight_test(t1110_serve_weights_api SOURCES tests/t1110_serve_weights_api.c
  LIBS arclight_model PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 120)
add_dependencies(t1110_serve_weights_api arclight)
