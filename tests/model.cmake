# The model engineer's tests of lib/model (tests 0600-0649): the transformer against PyTorch,
# layer gradients, packing, safetensors. They link arclight_model only (model-only builds too).
arclight_test(t0600_model_vs_pytorch SOURCES tests/t0600_model_vs_pytorch.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0601_model_layers SOURCES tests/t0601_model_layers.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0602_model_packed SOURCES tests/t0602_model_packed.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0603_model_safetensors SOURCES tests/t0603_model_safetensors.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0604_model_config SOURCES tests/t0604_model_config.c LIBS arclight_model TIMEOUT 60)
if(NOT ARCLIGHT_MODEL_ONLY)
  # runs the arclight binary ($ARCLIGHT_BIN), which model-only builds do not have
  arclight_test(t0605_model_cli SOURCES tests/t0605_model_cli.c LIBS arclight_model TIMEOUT 60)
endif()
arclight_test(t0606_model_kv SOURCES tests/t0606_model_kv.c LIBS arclight_model TIMEOUT 60)

# libFuzzer target for safetensors files and config.json (clang), in the sanitizer build or
# with -DARCLIGHT_FUZZ=ON, like the Avro and tokenizer targets; t0607 runs it on its corpus.
find_program(AL_MODEL_CLANG NAMES clang-14 clang)
if((ARCLIGHT_SANITIZE OR ARCLIGHT_FUZZ) AND AL_MODEL_CLANG)
  set(AL_MODEL_FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_model_files.c
      ${PROJECT_SOURCE_DIR}/lib/model/config.c ${PROJECT_SOURCE_DIR}/lib/model/model.c
      ${PROJECT_SOURCE_DIR}/lib/model/layers.c ${PROJECT_SOURCE_DIR}/lib/model/gemm.c
      ${PROJECT_SOURCE_DIR}/lib/model/safetensors.c ${PROJECT_SOURCE_DIR}/lib/model/json.c)
  add_custom_command(
    OUTPUT ${PROJECT_BINARY_DIR}/fuzz_model_files
    COMMAND ${AL_MODEL_CLANG} -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined
            -fno-sanitize-recover=undefined -I${PROJECT_SOURCE_DIR}/lib ${AL_MODEL_FUZZ_SOURCES}
            -o ${PROJECT_BINARY_DIR}/fuzz_model_files -lpthread -lm
    DEPENDS ${AL_MODEL_FUZZ_SOURCES} ${PROJECT_SOURCE_DIR}/lib/model/model.h
            ${PROJECT_SOURCE_DIR}/lib/model/config.h ${PROJECT_SOURCE_DIR}/lib/model/safetensors.h
    COMMENT "Building the fuzz target fuzz_model_files with ${AL_MODEL_CLANG}")
  add_custom_target(fuzz_model_files_target ALL DEPENDS ${PROJECT_BINARY_DIR}/fuzz_model_files)
  add_test(NAME t0607_model_files_fuzz
    COMMAND sh -c "rm -rf fuzz-model-scratch && mkdir -p fuzz-model-scratch && ./fuzz_model_files -seed=1 -runs=100000 -max_len=8192 -timeout=10 fuzz-model-scratch ${PROJECT_SOURCE_DIR}/tests/fuzz/model_corpus"
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(t0607_model_files_fuzz PROPERTIES TIMEOUT 120)
endif()
