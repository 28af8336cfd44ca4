# Reliability under failure (issue 15): tests 1600-1699. They run the arclight binary against
# embedded brokers that are frozen or killed mid-run; results are recorded in
# docs/RELIABILITY.md.
arclight_test(t1600_stop_without_kafka SOURCES tests/t1600_stop_without_kafka.c
  LIBS PkgConfig::RDKAFKA TIMEOUT 300)
add_dependencies(t1600_stop_without_kafka arclight)
# The capture proxy probed as an attacker would (issue 15, items 8-14), with the fake upstream.
arclight_test(t1601_proxy_hardening SOURCES tests/t1601_proxy_hardening.c tests/fake_upstream.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL PkgConfig::LIBEVENT
  TIMEOUT 300)
add_dependencies(t1601_proxy_hardening arclight)
