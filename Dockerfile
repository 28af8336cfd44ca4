# arclight on Debian 12: the project's own set-up script, a release build, one binary.
FROM debian:12
WORKDIR /src/arclight
COPY . .
RUN bash scripts/setup.sh \
 && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DARCLIGHT_CUDA=OFF \
 && cmake --build build -j"$(nproc)" --target arclight \
 && install -m 0755 build/arclight /usr/local/bin/arclight
ENTRYPOINT []
CMD ["arclight", "--help"]
