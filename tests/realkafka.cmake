# Real Apache Kafka (tests/kafka_fixture.h; the broker scripts/setup.sh fetches with Maven):
# tests 1500-1599, label `kafka`. The Kafka-facing tests of the other areas run on it too,
# as NAME_kafka (arclight_test's KAFKA option).
arclight_test(t1500_kafka_fixture SOURCES tests/t1500_kafka_fixture.c
  LIBS arclight_kafka LABELS kafka TIMEOUT 300)
add_dependencies(t1500_kafka_fixture arclight)
arclight_test(t1501_static_membership SOURCES tests/t1501_static_membership.c
  LIBS PkgConfig::RDKAFKA TIMEOUT 180 KAFKA)
add_dependencies(t1501_static_membership arclight)
# t1502: three nodes, the leader of the span partitions and the group coordinator killed
# with SIGKILL, then every node down for 8 s (docs/RELIABILITY.md).
arclight_test(t1502_replication_faults SOURCES tests/t1502_replication_faults.c tests/fake_upstream.c
  LIBS arclight_kafka arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL PkgConfig::LIBEVENT
  LABELS kafka TIMEOUT 600)
add_dependencies(t1502_replication_faults arclight)
# docker-compose.yml's services as processes on real Kafka (tests/compose_run.py)
arclight_test(t1503_compose_stack SOURCES tests/t1503_compose_stack.c
  LIBS PkgConfig::RDKAFKA LABELS kafka TIMEOUT 600)
add_dependencies(t1503_compose_stack arclight)
# t1504: the whole loop (proxy, credit, batch, train, serve following the policy) under
# kill -9 of every stage, broker restarts and a stalled upstream; the auditor
# (tests/t1598_loop_audit.h) reads every topic (docs/RELIABILITY.md). Label faults:
# `cd build-asan && ctest -L faults` runs it alone; scripts/test.sh runs it too.
arclight_test(t1504_whole_loop SOURCES tests/t1504_whole_loop.c
  LIBS arclight_kafka arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL
  LABELS kafka faults TIMEOUT 600)
add_dependencies(t1504_whole_loop arclight)
# t1504_whole_loop_embedded: the same chaos on the embedded broker (no broker kills: it keeps
# nothing across one); a restarted consumer stage has its partitions back within seconds
# there too (lib/kafka/member.c).
arclight_test(t1504_whole_loop_embedded SOURCES tests/t1504_whole_loop.c
  LIBS arclight_kafka arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL
  LABELS embedded faults TIMEOUT 600)
target_compile_definitions(t1504_whole_loop_embedded PRIVATE WL_EMBEDDED=1)
add_dependencies(t1504_whole_loop_embedded arclight)
# t1505: the same loop for 10 minutes at a fixed rate, RSS sampled (label soak: not in
# scripts/test.sh; `cd build-asan && ctest -L soak` runs it).
arclight_test(t1505_whole_loop_soak SOURCES tests/t1504_whole_loop.c
  LIBS arclight_kafka arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL
  LABELS kafka soak TIMEOUT 1200)
target_compile_definitions(t1505_whole_loop_soak PRIVATE WL_SOAK=1)
add_dependencies(t1505_whole_loop_soak arclight)
# t1506: --exactly-once (credit and batch) through kill -9, restarts and a rebalance; real
# Kafka only (the mock does not simulate transaction aborts; docs/RELIABILITY.md)
arclight_test(t1506_exactly_once SOURCES tests/t1506_exactly_once.c
  LIBS arclight_avro PkgConfig::RDKAFKA LABELS kafka TIMEOUT 300)
add_dependencies(t1506_exactly_once arclight)
# t1507: docker-compose.yml for real with podman-compose (tests/compose_podman.py): the
# image of this tree, Kafka and every stage in containers, 2 policy versions, every service
# stopped cleanly, the project removed. Label `compose` (not `kafka`: it needs no jars here,
# the Kafka image scripts/compose_deps.sh built has them). Skipped (exit 77) where podman or
# the base images are missing; both cores while it runs (a whole stack in containers).
arclight_test(t1507_compose_podman SOURCES tests/t1507_compose_podman.c
  LABELS compose TIMEOUT 900)
set_tests_properties(t1507_compose_podman PROPERTIES SKIP_RETURN_CODE 77 PROCESSORS 2)
