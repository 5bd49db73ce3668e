# batond and the baton CLI on Debian bookworm. See docker-compose.yml.

FROM rust:1.95-bookworm AS build
# bindgen needs libclang; .cargo/config.toml links Debian's librocksdb-dev
# (7.8.3) instead of compiling RocksDB from C++.
RUN apt-get update \
 && apt-get install -y --no-install-recommends clang libclang-dev librocksdb-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# ROCKSDB_LIB_DIR: .cargo/config.toml names the x86_64 directory; this one
# also fits other architectures (an environment variable wins over [env]).
RUN ROCKSDB_LIB_DIR=/usr/lib/$(gcc -dumpmachine) \
    cargo build --release --locked --bin batond --bin baton

FROM debian:bookworm-slim
# librocksdb7.8: the runtime library of librocksdb-dev 7.8.3. curl: healthchecks.
RUN apt-get update \
 && apt-get install -y --no-install-recommends librocksdb7.8 ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home-dir /var/lib/baton --shell /usr/sbin/nologin baton \
 && install -d -o baton -g baton -m 0700 /var/lib/baton
COPY --from=build /src/target/release/batond /src/target/release/baton /usr/local/bin/
USER baton
VOLUME /var/lib/baton
# client, peer, HTTP (/metrics, /health, /ready)
EXPOSE 7101 7201 7301
ENTRYPOINT ["batond"]
