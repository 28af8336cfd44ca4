# The GPU tests of lib/model (1700-1749): every CUDA op against the CPU backend, a whole
# training step, the PyTorch dumps in bf16, serving's greedy tokens and logprobs, two ranks
# of data parallelism over NCCL (1705: two GPUs). They link
# arclight_model only (model-only builds too) and open the CUDA module at run time; without a
# CUDA device they print "skipped: no CUDA device" and exit 77, which ctest reports as
# skipped. tests/gpu/run.sh runs them on a GPU machine.
foreach(t t1700_backend_ops t1701_backend_train_step t1702_backend_vs_pytorch t1703_backend_serve
          t1705_dist_nccl)
  arclight_test(${t} SOURCES tests/${t}.c LIBS arclight_model TIMEOUT 300 LABELS gpu)
  set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
endforeach()

# Data parallelism's host side (rank/world/address from the environment, errors, a world of
# one): runs everywhere.
arclight_test(t1704_dist SOURCES tests/t1704_dist.c LIBS arclight_model TIMEOUT 60)
# The backend choice and, where built, that the CUDA module loads with every symbol resolved.
arclight_test(t1706_cuda_module SOURCES tests/t1706_cuda_module.c LIBS arclight_model TIMEOUT 60)

# The GPU benchmark program (bench/bench_gpu.c: train / decode / save), built with the model
# library alone so that tests/gpu/run.sh builds it on a GPU machine (model-only).
add_executable(bench_gpu bench/bench_gpu.c)
target_link_libraries(bench_gpu PRIVATE arclight_model m)
# Data parallelism on CPUs over gloo: 2 and 3 ranks against one process, and a rank killed
# (issue 24). Skipped (77) in a build without gloo.
arclight_test(t1707_dist_gloo SOURCES tests/t1707_dist_gloo.c LIBS arclight_model TIMEOUT 180)
set_tests_properties(t1707_dist_gloo PROPERTIES SKIP_RETURN_CODE 77)
