# `arclight up` (tools/up.c) and the demo agent (examples/demo-agent): tests 1300-1349.
# They run the whole loop through the arclight binary, the embedded broker and node.
arclight_test(t1300_up SOURCES tests/t1300_up.c LIBS PkgConfig::RDKAFKA TIMEOUT 240 KAFKA)
add_dependencies(t1300_up arclight)
arclight_test(t1301_up_stop SOURCES tests/t1301_up_stop.c TIMEOUT 300)
add_dependencies(t1301_up_stop arclight)
arclight_test(t1302_up_learns SOURCES tests/t1302_up_learns.c TIMEOUT 300)
add_dependencies(t1302_up_learns arclight)
