# Credit benchmark: one `arclight credit` worker vs kcat on the same pre-filled topic.
#   cmake --build build --target bench_credit arclight && ./build/bench_credit
add_executable(bench_credit bench/bench_credit.c)
target_include_directories(bench_credit PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(bench_credit PRIVATE arclight_avro PkgConfig::RDKAFKA)
add_dependencies(bench_credit arclight)
add_dependencies(bench bench_credit)
