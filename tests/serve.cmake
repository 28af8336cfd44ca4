# The policy server (stages/serve): tests 1101-1199. They run the arclight binary
# (`arclight serve`, the embedded broker) over real sockets, with the tiny model.
arclight_test(t1101_serve SOURCES tests/t1101_serve.c
  LIBS arclight_model PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 120)
add_dependencies(t1101_serve arclight)
