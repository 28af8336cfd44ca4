# The capture proxy (stages/proxy): tests 1000-1099. The end-to-end tests run the arclight
# binary (`arclight proxy` and the embedded broker) against tests/fake_upstream.c, a
# vLLM-like upstream in the test process, over real sockets.
arclight_test(t1001_proxy SOURCES tests/t1001_proxy.c tests/fake_upstream.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL PkgConfig::LIBEVENT
  TIMEOUT 180)
add_dependencies(t1001_proxy arclight)
