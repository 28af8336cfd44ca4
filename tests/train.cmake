# Trainer stage: tests 1200-1249. The step assembler (stages/train/assembler.c, no Kafka) is
# built into its own library for the unit test; the stage test drives `arclight train`
# against the embedded broker over TCP.
add_library(arclight_train STATIC ${PROJECT_SOURCE_DIR}/stages/train/assembler.c)
target_include_directories(arclight_train PUBLIC ${PROJECT_SOURCE_DIR}/lib ${PROJECT_SOURCE_DIR}/stages)
target_link_libraries(arclight_train PUBLIC arclight_avro arclight_core arclight_model m)
arclight_test(t1200_train_assembly SOURCES tests/t1200_train_assembly.c LIBS arclight_train TIMEOUT 60)
arclight_test(t1201_train_stage SOURCES tests/t1201_train_stage.c LIBS arclight_kafka arclight_avro arclight_core TIMEOUT 240 KAFKA)
arclight_test(t1202_train_pipeline SOURCES tests/t1202_train_pipeline.c LIBS arclight_kafka arclight_avro arclight_core TIMEOUT 180 KAFKA)

# libFuzzer target for the step assembler fed chunks with any values a producer could write
# (tests/fuzz/fuzz_train_asm.c; arclight_fuzz: CMakeLists.txt).
arclight_fuzz(fuzz_train_asm TEST t1203_train_asm_fuzz CORPUS train_corpus RUNS 8000 MAX_LEN 2048
  SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_train_asm.c ${PROJECT_SOURCE_DIR}/stages/train/assembler.c
          ${AL_AVRO_FUZZ_SOURCES}
  DEPENDS ${PROJECT_SOURCE_DIR}/stages/train/assembler.h ${PROJECT_SOURCE_DIR}/lib/avro/codec.h
  INCLUDES ${PROJECT_SOURCE_DIR}/stages
  LIBS -ljansson -lcrypto)
# t1203: `arclight train` as 2 and 3 data-parallel CPU replicas (gloo) against one process,
# replicas that disagree, a replica killed mid-run (issue 24); skipped without gloo.
arclight_test(t1203_train_replicas SOURCES tests/t1203_train_replicas.c
  LIBS arclight_kafka arclight_avro arclight_model arclight_core PkgConfig::RDKAFKA TIMEOUT 400)
set_tests_properties(t1203_train_replicas PROPERTIES SKIP_RETURN_CODE 77)
add_dependencies(t1203_train_replicas arclight)

# Each version's directory is a Hugging Face model directory (issue 23): transformers 5 loads
# the trainer's step-N and its logprobs equal `arclight serve`'s, Qwen2 and Qwen3. The Python
# comes from $ARCLIGHT_PYTHON, ~/.cache/arclight/venv or tests/train/hf_venv.sh (a venv under
# the build directory, made once from the local index: a couple of minutes); exit 77 = skipped.
arclight_test(t1210_train_hf_dir SOURCES tests/t1210_train_hf_dir.c
  LIBS arclight_model arclight_avro arclight_core PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL
  TIMEOUT 600)
add_dependencies(t1210_train_hf_dir arclight)
set_tests_properties(t1210_train_hf_dir PROPERTIES SKIP_RETURN_CODE 77)
