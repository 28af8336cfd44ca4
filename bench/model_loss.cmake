# Loss-side benchmarks of the model library: logprobs + entropy + PPO loss + d/dlogits,
# arclight against PyTorch 1.13 in the same run (bench_logprob [T V iters]).
add_executable(bench_logprob bench/bench_logprob.c)
target_link_libraries(bench_logprob PRIVATE arclight_model m)
add_dependencies(bench bench_logprob)
