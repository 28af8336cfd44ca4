# The policy server (stages/serve): tests 1101-1199. They run the arclight binary
# (`arclight serve`, the embedded broker) over real sockets, with the tiny model.
arclight_test(t1101_serve SOURCES tests/t1101_serve.c
  LIBS arclight_model PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 120)
add_dependencies(t1101_serve arclight)
arclight_test(t1102_serve_swap SOURCES tests/t1102_serve_swap.c
  LIBS arclight_model arclight_avro arclight_core PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL
  TIMEOUT 120)
add_dependencies(t1102_serve_swap arclight)
arclight_test(t1103_serve_openai_node SOURCES tests/t1103_serve_openai_node.c
  LIBS arclight_model PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 120)
add_dependencies(t1103_serve_openai_node arclight)
arclight_test(t1104_serve_proxy SOURCES tests/t1104_serve_proxy.c
  LIBS arclight_model arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 120)
add_dependencies(t1104_serve_proxy arclight)
