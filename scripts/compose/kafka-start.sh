#!/bin/bash
# The start of the apache/kafka:4.1.1 stand-in (scripts/compose_deps.sh): every KAFKA_NAME
# variable becomes the server property name (lower case, _ as .), as the official image
# does; the log directory is formatted on first start (cluster id $CLUSTER_ID, or a fixed
# one), then the broker runs in the foreground.
set -euo pipefail
props=/opt/kafka/config/server.properties
: >"$props"
while IFS='=' read -r name value; do
  case "$name" in
    KAFKA_HEAP_OPTS|KAFKA_JVM_PERFORMANCE_OPTS|KAFKA_OPTS) ;;
    KAFKA_*) key=${name#KAFKA_}; key=${key,,}; echo "${key//_/.}=$value" >>"$props" ;;
  esac
done < <(env)
logdir=$(sed -n 's/^log\.dirs=//p' "$props")
logdir=${logdir:-/var/lib/kafka/data}
grep -q '^log\.dirs=' "$props" || echo "log.dirs=$logdir" >>"$props"
cp=(-cp '/opt/kafka/libs/*')
if [ ! -f "$logdir/meta.properties" ]; then
  java "${cp[@]}" kafka.tools.StorageTool format -t "${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}" \
    -c "$props" --ignore-formatted
fi
exec java ${KAFKA_HEAP_OPTS:--Xmx512m} "${cp[@]}" -Djava.awt.headless=true kafka.Kafka "$props"
