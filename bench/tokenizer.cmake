# Tokenizer benchmark: Qwen3 encode throughput against @huggingface/tokenizers under node
# on the same corpus and chunks (run from the repository root: build/bench_tokenizer).
add_executable(bench_tokenizer bench/bench_tokenizer.c)
target_link_libraries(bench_tokenizer PRIVATE arclight_model m)
target_compile_definitions(bench_tokenizer PRIVATE
  ARCLIGHT_QWEN3_TOKENIZER_DIR="${ARCLIGHT_QWEN3_TOKENIZER_DIR}")
add_dependencies(bench bench_tokenizer)
