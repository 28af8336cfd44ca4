# `arclight up` (tools/up.c), the self-driving demo agent (examples/demo-agent) and the letters
# demo through the rollout controller (examples/letters): tests 1300-1349.
# They run the whole loop through the arclight binary, the embedded broker and node.
arclight_test(t1300_up SOURCES tests/t1300_up.c LIBS PkgConfig::RDKAFKA TIMEOUT 240 KAFKA)
add_dependencies(t1300_up arclight)
arclight_test(t1301_up_stop SOURCES tests/t1301_up_stop.c TIMEOUT 300)
add_dependencies(t1301_up_stop arclight)
arclight_test(t1302_up_learns SOURCES tests/t1302_up_learns.c TIMEOUT 300)
add_dependencies(t1302_up_learns arclight)
# The README's main command, shortened: the letters demo through the rollout controller must
# raise the held-out reward (a sign test over the val tasks, p < 0.01).
arclight_test(t1303_up_rollouts_learn SOURCES tests/t1303_up_rollouts_learn.c
  LIBS PkgConfig::JANSSON TIMEOUT 1500)
add_dependencies(t1303_up_rollouts_learn arclight)
# TensorBoard event files of a short run, read back by TensorBoard's reader (scripts/setup.sh's
# venv; skipped, exit 77, without it) and compared with metrics.csv.
arclight_test(t1305_up_tensorboard SOURCES tests/t1305_up_tensorboard.c LIBS PkgConfig::JANSSON
  TIMEOUT 600)
set_tests_properties(t1305_up_tensorboard PROPERTIES SKIP_RETURN_CODE 77)
add_dependencies(t1305_up_tensorboard arclight)
# The same with an agent that posts only the final reward (issue 25), under up's defaults.
arclight_test(t1304_up_final_reward_learns SOURCES tests/t1304_up_final_reward_learns.c
  LIBS PkgConfig::JANSSON TIMEOUT 1500)
add_dependencies(t1304_up_final_reward_learns arclight)
# Two `arclight serve --weight-routes` replicas driven by `arclight sync` (up --weight-sync
# vllm), one killed mid-run: versions reach both, spans carry them, no rollout is lost.
arclight_test(t1306_up_fleet SOURCES tests/t1306_up_fleet.c
  LIBS arclight_avro arclight_core PkgConfig::RDKAFKA PkgConfig::JANSSON TIMEOUT 300)
add_dependencies(t1306_up_fleet arclight)
