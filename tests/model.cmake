# The model engineer's tests of lib/model (tests 0600-0649): the transformer against PyTorch,
# layer gradients, packing, safetensors. They link arclight_model only (model-only builds too).
#
# lib/model's tests, all registered in the tests/model*.cmake fragments (CMakeLists.txt
# includes them before the rest, model-only builds too):
#   0500       the JSON reader (lib/text, which arclight_model links; model_json.cmake)
#   0600-0649  the transformer, safetensors, the CLI (this file)
#   0650-0699  loss, optimizer, trainer, checkpoints; and 0810, the optimizer file's layout
#              (model_loss.cmake)
#   0700-0749  the tokenizer (lib/text, which arclight_model links; model_tokenizer.cmake)
#   1100-1109  inference: sampling, logprobs (model_infer.cmake)
#   1700-1749  the GPU backend and data parallelism (model_gpu.cmake)
arclight_test(t0600_model_vs_pytorch SOURCES tests/t0600_model_vs_pytorch.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0601_model_layers SOURCES tests/t0601_model_layers.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0602_model_packed SOURCES tests/t0602_model_packed.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0603_model_safetensors SOURCES tests/t0603_model_safetensors.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0604_model_config SOURCES tests/t0604_model_config.c LIBS arclight_model TIMEOUT 60)
if(NOT ARCLIGHT_MODEL_ONLY)
  # runs the arclight binary ($ARCLIGHT_BIN), which model-only builds do not have
  arclight_test(t0605_model_cli SOURCES tests/t0605_model_cli.c LIBS arclight_model TIMEOUT 60)
  # `arclight model sft` (tools/model_sft.c), the warm start from a file
  arclight_test(t0608_model_sft SOURCES tests/t0608_model_sft.c LIBS arclight_model arclight_text TIMEOUT 900)
  add_dependencies(t0608_model_sft arclight)
endif()
arclight_test(t0606_model_kv SOURCES tests/t0606_model_kv.c LIBS arclight_model TIMEOUT 60)

# libFuzzer target for safetensors files and config.json (arclight_fuzz: CMakeLists.txt).
arclight_fuzz(fuzz_model_files TEST t0607_model_files_fuzz CORPUS model_corpus RUNS 100000
  MAX_LEN 8192
  SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_model_files.c ${ARCLIGHT_MODEL_FUZZ_SOURCES}
  DEPENDS ${PROJECT_SOURCE_DIR}/lib/model/model.h ${PROJECT_SOURCE_DIR}/lib/model/config.h
          ${PROJECT_SOURCE_DIR}/lib/model/safetensors.h)
