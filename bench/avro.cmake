# Codec benchmark: build/bench_codec (results in docs/BENCHMARKS.md).
add_executable(bench_codec bench/bench_codec.c)
target_include_directories(bench_codec PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(bench_codec PRIVATE arclight_avro PkgConfig::AVRO)
add_dependencies(bench bench_codec)
