#!/usr/bin/env bash
# Starts a local 3-member cluster (release build, fsync on) and runs the
# `baton bench` workloads against it. Usage: scripts/bench.sh [SECS] [CLIENTS]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${CARGO_TARGET_DIR:-target}/release"
SECS=${1:-10}
CLIENTS=${2:-64}
DATA=$(mktemp -d /tmp/baton-bench.XXXXXX)
BASE=${BATON_BENCH_BASE_PORT:-7300}
export BATON_ENDPOINTS="127.0.0.1:$((BASE+1)),127.0.0.1:$((BASE+2)),127.0.0.1:$((BASE+3))"
"$BIN/batond" cluster --nodes 3 --data-dir "$DATA" --base-port "$BASE" > "$DATA/cluster.out" 2>&1 &
PID=$!
trap 'kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DATA"' EXIT
for _ in $(seq 100); do "$BIN/baton" status 2>/dev/null | grep -q leader && break; sleep 0.1; done
for w in create set get; do
  "$BIN/baton" bench "$w" --clients "$CLIENTS" --duration "${SECS}s"
done
