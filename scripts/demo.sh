#!/usr/bin/env bash
# The demo: a local 3-member cluster; write through one member, read through
# the others, kill -9 the leader, see a new leader with the data intact, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${CARGO_TARGET_DIR:-target}/release"
BATOND="$BIN/batond"
BATON="$BIN/baton"
DATA=$(mktemp -d /tmp/baton-demo.XXXXXX)
BASE=${BATON_DEMO_BASE_PORT:-7100}
EPS="127.0.0.1:$((BASE+1)),127.0.0.1:$((BASE+2)),127.0.0.1:$((BASE+3))"
export BATON_ENDPOINTS="$EPS"
CLUSTER_PID=""

cleanup() {
  if [ -n "$CLUSTER_PID" ] && kill -0 "$CLUSTER_PID" 2>/dev/null; then
    kill -TERM "$CLUSTER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$CLUSTER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$CLUSTER_PID" 2>/dev/null || true
  fi
  # Members the cluster process started, should it have died first.
  pkill -KILL -f -- "--data-dir=$DATA/" 2>/dev/null || true
  rm -rf "$DATA"
}
trap cleanup EXIT INT TERM

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

step "start a local 3-member cluster (batond cluster --nodes 3)"
"$BATOND" cluster --nodes 3 --data-dir "$DATA" --base-port "$BASE" > "$DATA/cluster.out" 2>&1 &
CLUSTER_PID=$!
for _ in $(seq 100); do grep -q '^endpoints:' "$DATA/cluster.out" 2>/dev/null && break; sleep 0.1; done
cat "$DATA/cluster.out"
for _ in $(seq 100); do "$BATON" status 2>/dev/null | grep -q leader && break; sleep 0.1; done
run "$BATON" status

step "write through member 1, read through members 2 and 3"
run "$BATON" --endpoints "127.0.0.1:$((BASE+1))" create /demo/config "max_workers=8" --parents
run "$BATON" --endpoints "127.0.0.1:$((BASE+1))" set /demo/config "max_workers=16"
for m in 2 3; do
  printf 'member %s says: ' "$m"; "$BATON" --endpoints "127.0.0.1:$((BASE+m))" get /demo/config
done
run "$BATON" --endpoints "127.0.0.1:$((BASE+2))" create /demo/job- "queued" --sequential
run "$BATON" --endpoints "127.0.0.1:$((BASE+3))" create /demo/job- "queued" --sequential
run "$BATON" ls /demo
run "$BATON" stat /demo/config

step "kill -9 the leader"
LEADER=$("$BATON" status --json | grep '"role":"leader"' | sed 's/.*"id":\([0-9]*\).*/\1/' | head -1)
PID=$(grep "^member $LEADER:" "$DATA/cluster.out" | sed 's/.*pid \([0-9]*\).*/\1/')
echo "leader is member $LEADER (pid $PID)"
run kill -9 "$PID"
START=$(date +%s%N)
for _ in $(seq 200); do
  NEW=$("$BATON" status --json 2>/dev/null | grep '"role":"leader"' | sed 's/.*"id":\([0-9]*\).*/\1/' | head -1 || true)
  [ -n "$NEW" ] && [ "$NEW" != "$LEADER" ] && break
  sleep 0.05
done
echo "new leader: member $NEW after $(( ($(date +%s%N) - START) / 1000000 )) ms"
run "$BATON" status || true

step "the data is intact, and writes go on"
run "$BATON" get /demo/config
run "$BATON" ls /demo
run "$BATON" create /demo/after-failover "ok"
run "$BATON" get /demo/after-failover

step "stop everything"
kill -TERM "$CLUSTER_PID"
wait "$CLUSTER_PID" 2>/dev/null || true
CLUSTER_PID=""
echo "cluster stopped; demo done"
