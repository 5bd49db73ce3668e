#!/usr/bin/env bash
# baton-bench's benchmark (the same loop `make compare` runs against etcd and
# ZooKeeper) on fresh local Baton clusters, release build, fsync on: each
# workload once. Usage: scripts/bench.sh [SECS]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
OUT=$(mktemp -d /tmp/baton-bench.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
for w in lock-uncontended lock-contended lock-independent write read; do
  cargo run --release -q -p baton-bench -- bench --target baton --workload "$w" \
    --duration "$SECS" --warmup 2 --runs 1 --out "$OUT/$w"
done
