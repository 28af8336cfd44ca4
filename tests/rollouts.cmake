# The rollout controller (stages/rollouts, `arclight rollouts`): tests 1400-1499.
set(AL_ROLLOUTS_LOGIC stages/rollouts/tasks.c stages/rollouts/controller.c stages/rollouts/report.c)
arclight_test(t1400_rollouts_logic SOURCES tests/t1400_rollouts_logic.c ${AL_ROLLOUTS_LOGIC}
  LIBS arclight_core PkgConfig::JANSSON TIMEOUT 60)
arclight_test(t1401_rollouts_agents SOURCES tests/t1401_rollouts_agents.c tests/fake_upstream.c
  LIBS arclight_avro PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL PkgConfig::LIBEVENT
  TIMEOUT 240)
add_dependencies(t1401_rollouts_agents arclight)
# The letters demo's three example agents (examples/letters), unchanged, through the
# controller, the proxy and serve on the tiny model (the tool agents warm-started first).
foreach(t t1402_letters_openai t1403_letters_langchain t1404_letters_agents_sdk)
  arclight_test(${t} SOURCES tests/${t}.c
    LIBS arclight_avro arclight_model PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 600)
  add_dependencies(${t} arclight)
endforeach()
# The Python agents of examples/letters (openai chat completions, the Responses API streamed,
# anthropic Messages) on scripts/setup.sh's venv; skipped (exit 77) where there is none.
foreach(t t1405_letters_openai_py t1406_letters_responses_py t1407_letters_anthropic_py)
  arclight_test(${t} SOURCES tests/${t}.c
    LIBS arclight_avro arclight_model PkgConfig::RDKAFKA PkgConfig::JANSSON PkgConfig::CURL TIMEOUT 600)
  set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
  add_dependencies(${t} arclight)
endforeach()
