# Real Apache Kafka (tests/kafka_fixture.h; the broker scripts/setup.sh fetches with Maven):
# tests 1500-1599, label `kafka`. The Kafka-facing tests of the other areas run on it too,
# as NAME_kafka (arclight_test's KAFKA option).
arclight_test(t1500_kafka_fixture SOURCES tests/t1500_kafka_fixture.c
  LIBS arclight_kafka LABELS kafka TIMEOUT 300)
add_dependencies(t1500_kafka_fixture arclight)
