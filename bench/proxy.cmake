# Capture proxy benchmark: build/bench_proxy (wrk at 64 and 4 connections, a fixed rate and one
# connection: direct, nginx proxy_pass,
# arclight proxy with capture on). Results in docs/BENCHMARKS.md.
add_executable(bench_proxy bench/bench_proxy.c tests/fake_upstream.c)
target_include_directories(bench_proxy PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(bench_proxy PRIVATE PkgConfig::JANSSON PkgConfig::LIBEVENT PkgConfig::RDKAFKA Threads::Threads)
add_dependencies(bench_proxy arclight)
add_dependencies(bench bench_proxy)
