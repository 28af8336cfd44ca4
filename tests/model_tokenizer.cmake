# Tokenizer tests (0700-0749): lib/text/tokenizer*.c, unicode*.c.
# The real Qwen3 tokenizer (11 MB of JSON) is committed compressed as
# tests/tokenizer/qwen3.tar.xz and unpacked here, at configure time, into the build tree
# (again whenever the archive is newer than the stamp).
set(ARCLIGHT_QWEN3_TOKENIZER_DIR ${CMAKE_BINARY_DIR}/tokenizer/qwen3)
set(_qwen3_archive ${PROJECT_SOURCE_DIR}/tests/tokenizer/qwen3.tar.xz)
set(_qwen3_stamp ${ARCLIGHT_QWEN3_TOKENIZER_DIR}/.unpacked)
if(NOT EXISTS ${_qwen3_stamp} OR NOT EXISTS ${ARCLIGHT_QWEN3_TOKENIZER_DIR}/tokenizer.json OR
   ${_qwen3_archive} IS_NEWER_THAN ${_qwen3_stamp})
  file(ARCHIVE_EXTRACT INPUT ${_qwen3_archive} DESTINATION ${ARCLIGHT_QWEN3_TOKENIZER_DIR})
  file(WRITE ${_qwen3_stamp} "unpacked from ${_qwen3_archive}\n")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_qwen3_archive})

arclight_test(t0700_tokenizer_ids SOURCES tests/t0700_tokenizer_ids.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0701_tokenizer_unicode SOURCES tests/t0701_tokenizer_unicode.c LIBS arclight_model TIMEOUT 60)
arclight_test(t0702_tokenizer_input SOURCES tests/t0702_tokenizer_input.c LIBS arclight_model TIMEOUT 60)
arclight_test(t0703_tokenizer_chat SOURCES tests/t0703_tokenizer_chat.c LIBS arclight_model TIMEOUT 60)

# libFuzzer target over untrusted text: tokenizer.json loading, encode/decode of arbitrary
# bytes, tool-call parsing of model output (arclight_fuzz: CMakeLists.txt).
arclight_fuzz(fuzz_tokenizer TEST t0704_tokenizer_fuzz CORPUS tokenizer_corpus RUNS 20000
  MAX_LEN 4096
  SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_tokenizer.c ${ARCLIGHT_TEXT_SOURCES}
  DEPENDS ${PROJECT_SOURCE_DIR}/lib/text/tokenizer.h ${PROJECT_SOURCE_DIR}/lib/text/unicode.h
          ${PROJECT_SOURCE_DIR}/lib/text/json.h
  ENV ARCLIGHT_SOURCE_DIR=${PROJECT_SOURCE_DIR})
