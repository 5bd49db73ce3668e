#!/usr/bin/env bash
# Installs the system packages Baton builds against, only if missing:
# clang + libclang-dev (bindgen for the rocksdb crate) and librocksdb-dev
# (Debian's RocksDB, linked instead of a 16-minute C++ build; see
# .cargo/config.toml), fonts-dejavu-core (text in the harness's plots) and
# protobuf-compiler (protoc, for the etcd-client crate the benchmark uses).
set -euo pipefail
need=()
for pkg in clang libclang-dev librocksdb-dev fonts-dejavu-core protobuf-compiler; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is not on PATH: install Rust (rustup) first" >&2
  exit 1
fi
[ ${#need[@]} -eq 0 ] && exit 0
echo "installing: ${need[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "not root: run 'sudo apt-get update && sudo apt-get install -y ${need[*]}'" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
