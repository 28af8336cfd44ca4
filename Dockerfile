# arclight on Debian 12: a release build (CPU backend), one binary, and what the demo's agent
# runs on: Node.js 20 (the example agents' npm packages want >= 20; Debian 12 ships 18) with
# examples/' npm packages, pinned by examples/package-lock.json. The source stays at
# /src/arclight (the letters demo, the tiny model's config and tokenizer, broker-config/).
# Runs as uid 10001; /var/lib/arclight/* (models, checkpoints, spool, rollouts) belong to it,
# so that named volumes mounted there (docker-compose.yml) start writable by it.
FROM node:20-bookworm-slim AS node

FROM debian:12
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      build-essential cmake pkg-config ca-certificates curl \
      librdkafka-dev libavro-dev libjansson-dev libevent-dev libcurl4-openssl-dev \
      libssl-dev libopenblas-dev zlib1g-dev libgloo-dev \
 && rm -rf /var/lib/apt/lists/*
COPY --from=node /usr/local/bin/node /usr/local/bin/node
COPY --from=node /usr/local/lib/node_modules/npm /usr/local/lib/node_modules/npm
RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm \
 && ln -s ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx
WORKDIR /src/arclight
COPY . .
RUN cd examples && npm ci --no-audit --no-fund \
 && cd .. \
 && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DARCLIGHT_CUDA=OFF \
 && cmake --build build -j"$(nproc)" --target arclight \
 && install -m 0755 build/arclight /usr/local/bin/arclight \
 && rm -rf build
RUN groupadd -g 10001 arclight && useradd -u 10001 -g 10001 -d /var/lib/arclight -M arclight \
 && mkdir -p /var/lib/arclight/models /var/lib/arclight/checkpoints /var/lib/arclight/spool \
      /var/lib/arclight/rollouts \
 && chown -R 10001:10001 /var/lib/arclight
USER 10001:10001
ENTRYPOINT []
CMD ["arclight", "--help"]
