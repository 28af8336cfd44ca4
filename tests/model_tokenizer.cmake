# Tokenizer tests (0700-0749): lib/model/tokenizer*.c, unicode*.c.
# The real Qwen3 tokenizer (11 MB of JSON) is committed compressed as
# tests/tokenizer/qwen3.tar.xz and unpacked here, at configure time, into the build tree.
set(ARCLIGHT_QWEN3_TOKENIZER_DIR ${CMAKE_BINARY_DIR}/tokenizer/qwen3)
set(_qwen3_archive ${PROJECT_SOURCE_DIR}/tests/tokenizer/qwen3.tar.xz)
if(NOT EXISTS ${ARCLIGHT_QWEN3_TOKENIZER_DIR}/tokenizer.json OR
   ${_qwen3_archive} IS_NEWER_THAN ${ARCLIGHT_QWEN3_TOKENIZER_DIR}/tokenizer.json)
  file(ARCHIVE_EXTRACT INPUT ${_qwen3_archive} DESTINATION ${ARCLIGHT_QWEN3_TOKENIZER_DIR} TOUCH)
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_qwen3_archive})

arclight_test(t0700_tokenizer_ids SOURCES tests/t0700_tokenizer_ids.c LIBS arclight_model TIMEOUT 120)
arclight_test(t0703_tokenizer_chat SOURCES tests/t0703_tokenizer_chat.c LIBS arclight_model TIMEOUT 60)
arclight_test(t0701_tokenizer_unicode SOURCES tests/t0701_tokenizer_unicode.c LIBS arclight_model TIMEOUT 60)
arclight_test(t0702_tokenizer_input SOURCES tests/t0702_tokenizer_input.c LIBS arclight_model TIMEOUT 60)
