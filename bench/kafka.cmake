# Kafka benchmark: produce + consume through the embedded broker with arclight's wrapper
# against kcat with the same settings in the same run (results in docs/BENCHMARKS.md).
#   cmake --build build --target bench_kafka && build/bench_kafka [MB] [message-bytes]
add_executable(bench_kafka bench/bench_kafka.c)
target_include_directories(bench_kafka PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(bench_kafka PRIVATE arclight_kafka Threads::Threads)
target_compile_definitions(bench_kafka PRIVATE ARCLIGHT_BIN_DEFAULT="$<TARGET_FILE:arclight>")
add_dependencies(bench_kafka arclight)
add_dependencies(bench bench_kafka)
