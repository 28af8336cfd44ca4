# Batching benchmark: build/bench_batch (results in docs/BENCHMARKS.md). Needs the batcher
# library from tests/batch.cmake and, for its over-TCP part, the arclight binary and kcat.
add_executable(bench_batch bench/bench_batch.c)
target_include_directories(bench_batch PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(bench_batch PRIVATE arclight_batch PkgConfig::RDKAFKA m)
add_dependencies(bench bench_batch)
