# Model benchmark: one training step of a ~10M-parameter Qwen2-style model, arclight's CPU
# backend against PyTorch 1.13 on the same model and batch, both on 2 threads.
#   cmake --build build --target bench_train_step    (or the whole `bench` target)
add_executable(bench_train_step_c bench/bench_train_step.c)
target_link_libraries(bench_train_step_c PRIVATE arclight_model m)
add_custom_target(bench_train_step
  COMMAND sh ${PROJECT_SOURCE_DIR}/bench/bench_train_step.sh $<TARGET_FILE:bench_train_step_c>
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
  DEPENDS bench_train_step_c
  USES_TERMINAL)
add_dependencies(bench bench_train_step)

# Data parallelism on CPUs over gloo: 1..3 replicas, the all-reduce against the step.
#   cmake --build build --target bench_dist && ./build/bench_dist 3 5
add_executable(bench_dist bench/bench_dist.c)
target_link_libraries(bench_dist PRIVATE arclight_model m)
