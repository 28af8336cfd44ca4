# Reliability under failure (issue 15): tests 1600-1699. They run the arclight binary against
# embedded brokers that are frozen or killed mid-run; results are recorded in
# docs/RELIABILITY.md.
arclight_test(t1600_stop_without_kafka SOURCES tests/t1600_stop_without_kafka.c
  LIBS PkgConfig::RDKAFKA TIMEOUT 300)
add_dependencies(t1600_stop_without_kafka arclight)
