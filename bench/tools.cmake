# Metrics and topic-tool benchmarks (results in docs/BENCHMARKS.md).
#   cmake --build build --target bench_metrics && build/bench_metrics [seconds-per-case]
#   cmake --build build --target bench_tools && build/bench_tools [messages] [value-bytes]
add_executable(bench_metrics bench/bench_metrics.c)
target_link_libraries(bench_metrics PRIVATE arclight_http Threads::Threads)
add_dependencies(bench bench_metrics)
add_executable(bench_tools bench/bench_tools.c)
target_include_directories(bench_tools PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(bench_tools PRIVATE arclight_avro PkgConfig::RDKAFKA)
target_compile_definitions(bench_tools PRIVATE ARCLIGHT_BIN_DEFAULT="$<TARGET_FILE:arclight>")
add_dependencies(bench_tools arclight)
add_dependencies(bench bench_tools)
