# tools: arclight tail / record / replay against a real embedded broker (tests/broker_fixture.h).
# They run the arclight binary, so it is built first.
#
# replay's recording reader (tools/recording_reader.c) inflates deflate blocks with zlib; the
# binary's link line lives in the root CMakeLists.txt, so the tools area adds zlib here.
find_package(ZLIB REQUIRED)
target_link_libraries(arclight PRIVATE ZLIB::ZLIB)

arclight_test(t0300_tail SOURCES tests/t0300_tail.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON TIMEOUT 180)
add_dependencies(t0300_tail arclight)
arclight_test(t0301_record_replay SOURCES tests/t0301_record_replay.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::AVRO TIMEOUT 180)
add_dependencies(t0301_record_replay arclight)
arclight_test(t0302_recording_reader SOURCES tests/t0302_recording_reader.c tools/recording_reader.c
  LIBS arclight_avro PkgConfig::AVRO PkgConfig::JANSSON ZLIB::ZLIB TIMEOUT 120)
target_include_directories(t0302_recording_reader PRIVATE ${PROJECT_SOURCE_DIR}/tools)
