#!/bin/bash
# The health check of the apache/kafka:4.1.1 stand-in (scripts/compose_deps.sh): succeeds when
# the broker of --bootstrap-server HOST:PORT accepts a TCP connection (the stand-in carries
# the broker's jars, not Kafka's command-line tools).
server=
while [ $# -gt 0 ]; do
  [ "$1" = --bootstrap-server ] && server=$2 && shift
  shift
done
exec 3<>"/dev/tcp/${server%:*}/${server##*:}"
