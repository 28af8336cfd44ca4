# Serve benchmark: decode tokens/s of `arclight serve` at 1 and 16 concurrent sequences for
# the tiny model and a ~100M-parameter Qwen2, against PyTorch 1.13 CPU generation with a KV
# cache on the same weights in the same run (results in docs/BENCHMARKS.md).
#   cmake --build build --target bench_serve
add_custom_target(bench_serve
  COMMAND ${CMAKE_COMMAND} -E env OMP_NUM_THREADS=2 /usr/bin/python3
          ${PROJECT_SOURCE_DIR}/bench/bench_serve.py --bin $<TARGET_FILE:arclight>
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
  DEPENDS arclight
  USES_TERMINAL)
add_dependencies(bench bench_serve)
