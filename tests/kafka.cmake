# Kafka plumbing and the embedded broker: tests 0200-0299. Every test that needs a broker
# starts `arclight broker --listen 127.0.0.1:0` (tests/broker_fixture.h) and talks TCP to it.
arclight_test(t0200_kafka_conf SOURCES tests/t0200_kafka_conf.c LIBS arclight_kafka TIMEOUT 60)
arclight_test(t0201_broker SOURCES tests/t0201_broker.c LIBS arclight_kafka TIMEOUT 120)
arclight_test(t0202_produce_consume SOURCES tests/t0202_produce_consume.c LIBS arclight_kafka TIMEOUT 120 KAFKA)
arclight_test(t0203_kill9_restart SOURCES tests/t0203_kill9_restart.c LIBS arclight_kafka TIMEOUT 240 KAFKA)
arclight_test(t0204_rebalance SOURCES tests/t0204_rebalance.c LIBS arclight_kafka TIMEOUT 300 KAFKA)
arclight_test(t0205_offset_gone SOURCES tests/t0205_offset_gone.c LIBS arclight_kafka TIMEOUT 120 KAFKA)
arclight_test(t0206_deadletter SOURCES tests/t0206_deadletter.c LIBS arclight_kafka arclight_avro TIMEOUT 120 KAFKA)
